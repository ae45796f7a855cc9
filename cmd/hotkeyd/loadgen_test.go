package main

import (
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
