package redact

import "testing"

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://alice:s3cret@10.0.0.5:4222": "nats://alice:xxxxx@10.0.0.5:4222",
		"redis://:pw@127.0.0.1:6379/0":      "redis://:xxxxx@127.0.0.1:6379/0",
		"nats://127.0.0.1:4222":             "nats://127.0.0.1:4222",
		"nats://token@127.0.0.1:4222":       "nats://xxxxx@127.0.0.1:4222", // a NATS token
		"tls://token@127.0.0.1:4222":        "tls://xxxxx@127.0.0.1:4222",
		"redis://alice@127.0.0.1:6379":      "redis://alice@127.0.0.1:6379", // no password to hide
		"127.0.0.1:6379":                    "127.0.0.1:6379",
		"%zz":                               "%zz",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
	if got := URLs([]string{"nats://a:b@h:1", " nats://h:2 "}); got != "nats://a:xxxxx@h:1,nats://h:2" {
		t.Errorf("URLs = %q", got)
	}
}
