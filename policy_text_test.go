package hotkey

import (
	"encoding"
	"encoding/json"
	"flag"
	"io"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestPolicyText: Fallback and Sync read and write their configuration
// names through encoding.TextUnmarshaler, so encoding/json, YAML and
// flag.TextVar take them; an unknown name is refused with the names that
// are known and leaves the value as it was.
func TestPolicyText(t *testing.T) {
	type text interface {
		encoding.TextMarshaler
		encoding.TextUnmarshaler
		String() string
	}
	for _, c := range []struct {
		give string
		new  func() text
		want string // the value's String after the name was read
		err  string
	}{
		{give: "local", new: func() text { f := FallbackClosed; return &f }, want: "local"},
		{give: "open", new: func() text { return new(Fallback) }, want: "open"},
		{give: "closed", new: func() text { return new(Fallback) }, want: "closed"},
		{give: "error", new: func() text { return new(Fallback) }, want: "error"},
		{give: "sometimes", new: func() text { f := FallbackOpen; return &f }, want: "open",
			err: `unknown fallback: "sometimes" (want local, open, closed or error)`},
		{give: "store", new: func() text { s := SyncGossip; return &s }, want: "store"},
		{give: "reserve", new: func() text { return new(Sync) }, want: "reserve"},
		{give: "gossip", new: func() text { return new(Sync) }, want: "gossip"},
		{give: "bogus", new: func() text { s := SyncReserve; return &s }, want: "reserve",
			err: `unknown sync mode: "bogus" (want store, reserve or gossip)`},
	} {
		v := c.new()
		err := v.UnmarshalText([]byte(c.give))
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%T UnmarshalText(%q) = %v: want error %q", v, c.give, err, c.err)
			}
		} else if err != nil {
			t.Errorf("%T UnmarshalText(%q) = %v", v, c.give, err)
		}
		if v.String() != c.want {
			t.Errorf("%T UnmarshalText(%q): %v, want %v", v, c.give, v, c.want)
		}
		if out, err := v.MarshalText(); err != nil || string(out) != c.want {
			t.Errorf("%T MarshalText of %v = %q, %v: want %q", v, v, out, err, c.want)
		}
	}
	for _, v := range []encoding.TextMarshaler{Fallback(numFallbacks), Sync(numSyncs)} {
		if out, err := v.MarshalText(); err == nil {
			t.Errorf("%T MarshalText of %v = %q: want an error", v, v, out)
		}
	}
}

// TestPolicyTextDecoders: the decoders a configuration goes through.
func TestPolicyTextDecoders(t *testing.T) {
	type conf struct {
		OnStoreFailure Fallback `json:"on_store_failure" yaml:"on_store_failure"`
		Sync           Sync     `json:"sync" yaml:"sync"`
	}
	want := conf{OnStoreFailure: FallbackClosed, Sync: SyncGossip}

	var j conf
	if err := json.Unmarshal([]byte(`{"on_store_failure":"closed","sync":"gossip"}`), &j); err != nil || j != want {
		t.Errorf("json: %+v, %v; want %+v", j, err, want)
	}
	if out, err := json.Marshal(want); err != nil || string(out) != `{"on_store_failure":"closed","sync":"gossip"}` {
		t.Errorf("json.Marshal = %s, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"sync":"eventually"}`), &j); err == nil {
		t.Errorf("json took sync %q", "eventually")
	}

	var y conf
	if err := yaml.Unmarshal([]byte("on_store_failure: closed\nsync: gossip\n"), &y); err != nil || y != want {
		t.Errorf("yaml: %+v, %v; want %+v", y, err, want)
	}

	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f conf
	fs.TextVar(&f.OnStoreFailure, "fallback", FallbackLocal, "")
	fs.TextVar(&f.Sync, "sync", SyncStore, "")
	if err := fs.Parse([]string{"-fallback", "closed", "-sync", "gossip"}); err != nil || f != want {
		t.Errorf("flag.TextVar: %+v, %v; want %+v", f, err, want)
	}
	if err := fs.Parse([]string{"-sync", "eventually"}); err == nil {
		t.Errorf("flag.TextVar took sync %q", "eventually")
	}
}
