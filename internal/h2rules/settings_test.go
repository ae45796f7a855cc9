package h2rules_test

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/net/http2"

	"github.com/hotkeyd/hotkey/internal/h2rules"
)

// settingsFrame returns a SETTINGS frame of ps, as a peer's reader gets it.
func settingsFrame(t *testing.T, ps ...http2.Setting) *http2.SettingsFrame {
	t.Helper()
	var b bytes.Buffer
	fr := http2.NewFramer(&b, &b)
	fr.AllowIllegalWrites = true
	if err := fr.WriteSettings(ps...); err != nil {
		t.Fatal(err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	return f.(*http2.SettingsFrame)
}

func TestReadSettings(t *testing.T) {
	window := func(v uint32) http2.Setting { return http2.Setting{ID: http2.SettingInitialWindowSize, Val: v} }
	many := func(n int) []http2.Setting {
		ps := make([]http2.Setting, n)
		for i := range ps {
			ps[i] = window(uint32(i))
		}
		return ps
	}
	cases := []struct {
		name       string
		give       []http2.Setting
		wantWindow int64 // -1: not set
		wantFrame  int64
		wantErr    http2.ErrCode // 0: none
	}{
		{name: "none", wantWindow: -1, wantFrame: -1},
		{name: "one of each", give: []http2.Setting{window(7), {ID: http2.SettingMaxFrameSize, Val: 20000}}, wantWindow: 7, wantFrame: 20000},
		{name: "the last of a parameter given twice", give: []http2.Setting{window(1<<31 - 1), window(9)}, wantWindow: 9, wantFrame: -1},
		{name: "unknown parameters ignored", give: []http2.Setting{{ID: 0xf0f0, Val: 1}, window(3)}, wantWindow: 3, wantFrame: -1},
		{name: "MaxSettings parameters", give: many(h2rules.MaxSettings), wantWindow: h2rules.MaxSettings - 1, wantFrame: -1},
		{name: "over MaxSettings parameters", give: many(h2rules.MaxSettings + 1), wantErr: http2.ErrCodeProtocol},
		{name: "a frame size under 16384, replaced", give: []http2.Setting{{ID: http2.SettingMaxFrameSize, Val: 16383}, {ID: http2.SettingMaxFrameSize, Val: 16384}}, wantErr: http2.ErrCodeProtocol},
	}
	for _, tc := range cases {
		s, err := h2rules.ReadSettings(settingsFrame(t, tc.give...))
		if tc.wantErr != 0 {
			if ce, ok := errors.AsType[http2.ConnectionError](err); !ok || http2.ErrCode(ce) != tc.wantErr {
				t.Errorf("%s: error %v, want connection error %v", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for _, p := range []struct {
			id   http2.SettingID
			want int64
		}{{http2.SettingInitialWindowSize, tc.wantWindow}, {http2.SettingMaxFrameSize, tc.wantFrame}} {
			got := int64(-1)
			if v, ok := s.Value(p.id); ok {
				got = int64(v)
			}
			if got != p.want {
				t.Errorf("%s: %v %d, want %d", tc.name, p.id, got, p.want)
			}
		}
	}
}
