// Command hotkeyd is the hotkey rate-limiting engine as a daemon: an HTTP
// API (POST /v1/allow), a NATS micro service (hotkey.allow), Prometheus
// metrics, a YAML policies file, and an embedded NATS server by default.
//
//	hotkeyd                                  # memory counters, embedded NATS on 127.0.0.1:4222, HTTP on 127.0.0.1:8080
//	hotkeyd --nats none                      # the same alone, with no NATS at all
//	hotkeyd --redis redis://127.0.0.1:6379 --policies policies.yaml
//	hotkeyd --help                           # every flag, its environment variable and default
//
// See docs/api.md for the API.
package main

import (
	"os"

	"github.com/hotkeyd/hotkey/internal/daemon"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
var version string

func main() {
	os.Exit(daemon.Main(version, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}
