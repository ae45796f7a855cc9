package main

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestLoadgen: hotkeyd loadgen against a running hotkeyd. While it runs, the
// hot key shows split in the daemon's /v1/hotkeys and in loadgen's progress
// line; stopped by SIGINT, it prints its summary and exits 0.
func TestLoadgen(t *testing.T) {
	d := startDaemon(t, daemonOpts{args: []string{"--hot-threshold", "50"}})
	var out, errOut testkit.Buffer
	cmd := exec.Command(bin, "loadgen", "--target", d.base, "--status", d.admin, "--rate", "400", "--hot-rate", "200",
		"--duration", "10m", "--keys", "50", "--key", "tenant:acme")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()

	took := testkit.For(t, testkit.Patience, "tenant:acme split in /v1/hotkeys", func() bool {
		for _, h := range d.hotKeys(t).HotKeys {
			if h.Policy == "default" && h.Key == "tenant:acme" && h.Level >= 4 {
				return true
			}
		}
		return false
	})
	t.Logf("split in /v1/hotkeys within %v", took)
	split := regexp.MustCompile(`level (\d+)`)
	testkit.For(t, testkit.Patience, "a progress line with the key split", func() bool {
		for _, m := range split.FindAllStringSubmatch(errOut.String(), -1) {
			if n, _ := strconv.Atoi(m[1]); n >= 4 {
				return true
			}
		}
		return false
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var err error
	testkit.For(t, testkit.Patience, "loadgen to stop on SIGINT", func() bool {
		select {
		case err = <-exited:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Fatalf("loadgen: %v\nstderr: %s", err, errOut.String())
	}
	for _, want := range []string{"decided", "latency (ms)", `key "tenant:acme"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(errOut.String(), "stopped early") {
		t.Errorf("stderr does not say the run stopped early: %q", errOut.String())
	}
}

// TestLoadgenGRPC: hotkeyd loadgen aimed at a hotkeyd's Envoy rate-limit
// service, on the memory store and on a redis-server: 60 requests of one
// user at 25 a day are 25 admitted and 35 denied, as many as a perfect
// limiter admits, and the answers report the user's limit.
func TestLoadgenGRPC(t *testing.T) {
	rules := writeFile(t, "rules.yaml", `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 25}
`)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			args := []string{"--envoy-config", rules}
			if store == "redis" {
				args = append(args, "--redis", "redis://"+startRedis(t).Addr)
			}
			d := startDaemon(t, daemonOpts{args: args})
			var out, errOut testkit.Buffer
			cmd := exec.Command(bin, "loadgen", "--target", "grpc://"+d.grpcAddr, "--domain", "bench", "--descriptor", "user={key}",
				"--workload", "key", "--key", "alice", "--rate", "300", "--duration", "200ms", "--limit", "25", "--period", "24h", "--json", "--progress=false")
			cmd.Stdout, cmd.Stderr = &out, &errOut
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Run(); err != nil {
				t.Fatalf("loadgen: %v\nstderr: %s", err, errOut.String())
			}
			var sum struct {
				Sent, Allowed, Denied, Errors int64
				Key                           struct {
					Ideal struct {
						Ideal   int64
						OfIdeal float64 `json:"admitted_of_ideal"`
					}
				}
				Quotas    int64
				LastQuota struct{ Limit int64 } `json:"last_quota"`
			}
			if err := json.Unmarshal([]byte(out.String()), &sum); err != nil {
				t.Fatalf("--json: %v: %s", err, out.String())
			}
			t.Logf("%+v", sum)
			if sum.Sent != 60 || sum.Allowed != 25 || sum.Denied != 35 || sum.Errors != 0 || sum.Key.Ideal.Ideal != 25 || sum.Key.Ideal.OfIdeal != 1 {
				t.Errorf("%d sent: %d admitted, %d denied, %d errors, ideal %d; want 60: 25, 35, 0, 25", sum.Sent, sum.Allowed, sum.Denied, sum.Errors, sum.Key.Ideal.Ideal)
			}
			if sum.Quotas != 60 || sum.LastQuota.Limit != 25 {
				t.Errorf("%d quotas, the last of limit %d; want 60 of 25", sum.Quotas, sum.LastQuota.Limit)
			}
		})
	}
}
