package deploy_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/daemon"
)

// TestKubernetesDrainDelay: the Deployment's hotkeyd runs with a
// --drain-delay, so that after SIGTERM the Service's endpoints stop routing
// to the pod before its listeners close, and its terminationGracePeriodSeconds
// leaves room for a preStop hook (if any), the delay and the graceful
// shutdown before the kubelet's SIGKILL.
func TestKubernetesDrainDelay(t *testing.T) {
	type lifecycle struct {
		PreStop *struct {
			Exec  *struct{ Command []string }
			Sleep *struct{ Seconds int64 }
		} `yaml:"preStop"`
	}
	var dep k8sObject
	for _, o := range loadK8s(t) {
		if o.Kind == "Deployment" {
			dep = o
		}
	}
	var spec struct {
		Template struct {
			Spec struct {
				TerminationGracePeriodSeconds *int64 `yaml:"terminationGracePeriodSeconds"`
				Containers                    []struct {
					container `yaml:",inline"`
					Lifecycle *lifecycle `yaml:"lifecycle"`
				}
			}
		}
	}
	if err := dep.Spec.Decode(&spec); err != nil {
		t.Fatalf("%s: Deployment: %v", dep.file, err)
	}
	where := dep.file + ": Deployment " + dep.name()
	fin := parseDockerfile(t).final()
	found := false
	for _, c := range spec.Template.Spec.Containers {
		if !strings.Contains(c.Image, "hotkeyd") {
			continue
		}
		found = true
		cfg := containerConfig(t, where, fin, &c.container)
		if cfg.DrainDelay <= 0 {
			t.Errorf("%s: no --drain-delay: a pod stops accepting at SIGTERM, while the Service still sends it requests for a few seconds", where)
		}
		var preStop time.Duration
		if l := c.Lifecycle; l != nil && l.PreStop != nil {
			switch p := l.PreStop; {
			case p.Sleep != nil:
				preStop = time.Duration(p.Sleep.Seconds) * time.Second
			case p.Exec != nil && len(p.Exec.Command) == 2 && p.Exec.Command[0] == "sleep":
				s, err := strconv.Atoi(p.Exec.Command[1])
				if err != nil {
					t.Fatalf("%s: preStop %q: %v", where, p.Exec.Command, err)
				}
				preStop = time.Duration(s) * time.Second
			default:
				t.Fatalf("%s: a preStop hook this test cannot time: %+v", where, p)
			}
		}
		if spec.Template.Spec.TerminationGracePeriodSeconds == nil {
			t.Fatalf("%s: no terminationGracePeriodSeconds (Kubernetes gives 30 s)", where)
		}
		grace := time.Duration(*spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
		need := preStop + cfg.DrainDelay + daemon.ShutdownTimeout
		t.Logf("preStop %v + --drain-delay %v + shutdown %v = %v, terminationGracePeriodSeconds %v", preStop, cfg.DrainDelay, daemon.ShutdownTimeout, need, grace)
		if need >= grace {
			t.Errorf("%s: preStop %v + --drain-delay %v + shutdown %v = %v, not under terminationGracePeriodSeconds %v: the kubelet would kill hotkeyd with decisions in flight",
				where, preStop, cfg.DrainDelay, daemon.ShutdownTimeout, need, grace)
		}
	}
	if !found {
		t.Fatalf("%s: no hotkeyd container", where)
	}
}
