package bench

import (
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/loadgen"
)

// BenchmarkConvergence measures how long a hot key announced by one
// instance takes to be applied by the others: 3 engines, each with a NATS
// coordinator on its own node of a 3-node cluster on loopback. Each
// operation announces a new key from a random instance and waits until the
// two others have applied it; every (announcement, instance) pair is one
// sample of publish-to-applied latency, reported as p50-ms and p99-ms.
func BenchmarkConvergence(b *testing.B) {
	c, err := scenario.StartConvergence()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var lat loadgen.Histogram
	b.ResetTimer()
	if err := c.Measure(b.N, &lat); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat.Quantile(0.50)), "p50-ms")
	b.ReportMetric(ms(lat.Quantile(0.99)), "p99-ms")
}
