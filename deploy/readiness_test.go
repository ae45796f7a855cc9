package deploy_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/daemon"
)

// TestKubernetesProbesKeepFallbacks: the Deployment's readiness probe is
// /readyz, not its strict form, and its liveness probe /healthz; a daemon
// whose Redis is down answers that readiness probe 200, degraded, so a
// store outage leaves the pods in the Service and each policy's
// on_store_failure decides.
func TestKubernetesProbesKeepFallbacks(t *testing.T) {
	var c *container
	for _, o := range loadK8s(t) {
		if o.Kind != "Deployment" {
			continue
		}
		var spec deploymentSpec
		if err := o.Spec.Decode(&spec); err != nil {
			t.Fatalf("%s: Deployment: %v", o.file, err)
		}
		for i := range spec.Template.Spec.Containers {
			if strings.Contains(spec.Template.Spec.Containers[i].Image, "hotkeyd") {
				c = &spec.Template.Spec.Containers[i]
			}
		}
	}
	if c == nil {
		t.Fatal("no Deployment with a hotkeyd container")
	}
	for _, p := range []struct {
		name, path string
		probe      *probe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path {
			t.Fatalf("container %s: %s %+v, want an httpGet of %s (no query: ?strict=true takes every pod out of the Service while Redis is down)", c.Name, p.name, p.probe, p.path)
		}
	}

	// A Redis that is not there: a loopback port just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	redisAddr := ln.Addr().String()
	ln.Close()
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--redis", "redis://"+redisAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		d.Shutdown(ctx)
	}()
	resp, err := http.Get("http://" + d.Addr() + c.ReadinessProbe.HTTPGet.Path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var body struct{ Status, Reason string }
	if err := json.Unmarshal(b, &body); err != nil || resp.StatusCode != http.StatusOK || body.Status != "degraded" || !strings.Contains(body.Reason, "Redis") {
		t.Errorf("readiness probe %s with Redis down: %s %s, want 200 degraded naming Redis", c.ReadinessProbe.HTTPGet.Path, resp.Status, b)
	}
}
