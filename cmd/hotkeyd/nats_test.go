package main

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// TestNATSAPI: the micro service "hotkey" on hotkey.allow answers with the
// JSON of POST /v1/allow, errors are micro errors, and the standard ping
// and info subjects find it.
func TestNATSAPI(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{args: []string{"--policies", writeFile(t, "p.yaml", testPolicies)}})
	nc, err := nats.Connect(d.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req := func(body string) *nats.Msg {
		t.Helper()
		m, err := nc.Request("hotkey.allow", []byte(body), 30*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", body, err)
		}
		return m
	}

	// The same JSON as over HTTP, field for field.
	m := req(`{"key":"n1"}`)
	if m.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("error reply: %v %s", m.Header, m.Data)
	}
	h := d.allow(t, `{"key":"h1"}`)
	var viaNATS, viaHTTP map[string]any
	if err := json.Unmarshal(m.Data, &viaNATS); err != nil {
		t.Fatalf("%s: %v", m.Data, err)
	}
	h.json(t, &viaHTTP)
	if !reflect.DeepEqual(keys(viaNATS), keys(viaHTTP)) {
		t.Errorf("fields over NATS %v, over HTTP %v", keys(viaNATS), keys(viaHTTP))
	}
	var a allowResp
	if err := json.Unmarshal(m.Data, &a); err != nil || !*a.Allowed || *a.Limit != 100 || *a.Remaining != 99 || *a.Shards != 1 {
		t.Errorf("reply %s", m.Data)
	}
	// A denial is a reply too, with allowed false.
	for i := 0; i < 6; i++ {
		m = req(`{"policy":"login","key":"mallory"}`)
	}
	if err := json.Unmarshal(m.Data, &a); err != nil || *a.Allowed || *a.RetryAfterMs <= 0 || m.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Errorf("6th login in a minute: %s %v", m.Data, m.Header)
	}

	errs := []struct {
		body, code, msg string
	}{
		{`{"key":`, "400", "malformed JSON body"},
		{`{"key":""}`, "400", "empty key"},
		{`{"key":"k","cost":-1}`, "400", "cost must not be negative"},
		{`{"key":"k","cost":1000}`, "400", "over policy \"default\"'s burst of 100"},
		{`{"key":"` + strings.Repeat("x", 600) + `"}`, "400", "longer than the 512 allowed"},
		{`{"policy":"nope","key":"k"}`, "404", `unknown policy "nope"`},
	}
	for _, e := range errs {
		m := req(e.body)
		code, desc := m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader)
		if code != e.code || !strings.Contains(desc, e.msg) {
			t.Errorf("%.40s: code %q description %q, want %s with %q", e.body, code, desc, e.code, e.msg)
		}
		var body struct{ Error string }
		if err := json.Unmarshal(m.Data, &body); err != nil || body.Error != desc {
			t.Errorf("%.40s: body %s, want {\"error\": the description}", e.body, m.Data)
		}
	}

	// Discovery.
	m, err = nc.Request("$SRV.PING.hotkey", nil, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Name != "hotkey" || ping.Type != micro.PingResponseType {
		t.Errorf("$SRV.PING.hotkey: %s %v", m.Data, err)
	}
	m, err = nc.Request("$SRV.INFO.hotkey", nil, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil || len(info.Endpoints) != 1 ||
		info.Endpoints[0].Subject != "hotkey.allow" || info.Endpoints[0].QueueGroup != micro.DefaultQueueGroup {
		t.Errorf("$SRV.INFO.hotkey: %s %v", m.Data, err)
	}
	if info.Version != "0.0.0-test" {
		t.Errorf("service version %q, want the binary's v0.0.0-test", info.Version)
	}
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
