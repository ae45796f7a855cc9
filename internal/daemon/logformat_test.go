package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestLogFormat: --log-format json logs JSON objects, a line each;
// HOTKEYD_LOG_FORMAT sets it too; other values are refused.
func TestLogFormat(t *testing.T) {
	for _, c := range []struct {
		args    []string
		environ map[string]string
	}{{[]string{"--log-format", "json"}, nil}, {nil, map[string]string{"HOTKEYD_LOG_FORMAT": "json"}}} {
		args := append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--nats", NATSNone}, c.args...)
		cfg, err := ParseArgs(args, env(c.environ), nil)
		if err != nil {
			t.Fatal(err)
		}
		var logs testkit.Buffer
		d, err := Start(context.Background(), cfg, slog.New(logHandler(cfg, &logs)), "test")
		if err != nil {
			t.Fatal(err)
		}
		shutdown(t, d)
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		for _, l := range lines {
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil || rec["time"] == nil {
				t.Errorf("%v %v: log line %q: %v, want a JSON object with time, level and msg", c.args, c.environ, l, err)
			}
		}
		if len(lines) < 2 {
			t.Errorf("%v %v: %d log lines, want the start's and the shutdown's", c.args, c.environ, len(lines))
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main("", []string{"--log-format", "yaml"}, env(nil), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `--log-format (HOTKEYD_LOG_FORMAT) "yaml": want text or json`) {
		t.Errorf("--log-format yaml: code %d, %q", code, stderr.String())
	}
	var logs bytes.Buffer
	cfg, err := ParseArgs(nil, env(nil), nil)
	if err != nil || cfg.LogFormat != LogText {
		t.Fatalf("default: %q, %v; want text", cfg.LogFormat, err)
	}
	slog.New(logHandler(cfg, &logs)).Info("hello", "k", "v")
	if got := logs.String(); !strings.Contains(got, "level=INFO msg=hello k=v") {
		t.Errorf("text: %q", got)
	}
}
