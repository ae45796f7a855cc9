package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `goos: linux
cpu: AMD EPYC
BenchmarkAllowMemory/detector=true-2      	 3336436	       700.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkAllowMemory/detector=false-2      	 3336436	       650.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkAllowXTimeRate-2   	 1870364	      1400 ns/op	       0 B/op	       0 allocs/op
BenchmarkAllowRedis-2   	 100	      10000 ns/op	 150000 decisions/s
BenchmarkAllowRedisRate-2   	 100	      30000 ns/op	 40000 decisions/s
BenchmarkHotKeyCluster/level=1-2 	1	4000 ns/op	3.000 max/mean-node-ops
BenchmarkHotKeyCluster/level=16-2 	1	4000 ns/op	1.126 max/mean-node-ops
BenchmarkGossipDecision/sync=store-2 	1000000	      600.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkGossipDecision/sync=gossip-2 	1000000	      660.0 ns/op	       0 B/op	       0 allocs/op
PASS
`

func TestReport(t *testing.T) {
	var out bytes.Buffer
	if err := run(strings.NewReader(sample), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"| engine+memory ns/op ÷ map+mutex of x/time/rate | 0.500 | ≤ 1.000 | yes |",
		"| engine+Redis decisions/s ÷ redis_rate | 3.750 | ≥ 3.000 | yes |",
		"| hot key at level 16: busiest master ÷ mean | 1.126 | ≤ 1.150 | yes |",
		"| engine+memory allocs/op (existing key) | 0 | ≤ 0 | yes |",
		"- cpu: AMD EPYC",
		"| engine+memory with the detector ÷ without | 1.077 | ≤ 1.150 | yes |",
		"| engine+memory sync: gossip ÷ sync: store, ns/op (10,000 keys, rounds published to NATS) | 1.100 | ≤ 1.150 | yes |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

func TestReportRejectsEmptyInput(t *testing.T) {
	if err := run(strings.NewReader("PASS\n"), &bytes.Buffer{}); err == nil {
		t.Error("no error for input without benchmarks")
	}
}

func TestReportTakesMedians(t *testing.T) {
	in := `BenchmarkAllowRedis-2 1 1 ns/op 100 decisions/s
BenchmarkAllowRedisRate-2 1 1 ns/op 10 decisions/s
BenchmarkAllowRedis-2 1 1 ns/op 400 decisions/s
BenchmarkAllowRedisRate-2 1 1 ns/op 50 decisions/s
BenchmarkAllowRedis-2 1 1 ns/op 300 decisions/s
BenchmarkAllowRedisRate-2 1 1 ns/op 100 decisions/s
`
	var out bytes.Buffer
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	// round ratios 10, 8 and 3: the median is 8
	if want := "| engine+Redis decisions/s ÷ redis_rate | 8.000 | ≥ 3.000 | yes |"; !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
	if !strings.Contains(out.String(), "median of 3 round(s)") {
		t.Errorf("report does not say how many rounds:\n%s", out.String())
	}
}

func TestCompare(t *testing.T) {
	base := `cpu: AMD EPYC
BenchmarkAllowMemory/detector=true-2 	 100	 800.0 ns/op	 0 allocs/op
BenchmarkAllowMemory/detector=true-2 	 100	 1000 ns/op	 0 allocs/op
BenchmarkDaemon/rtt=local/api=http-2 	 100	 50000 decisions/s
BenchmarkGone-2 	 100	 5.0 ns/op
`
	this := `cpu: AMD EPYC
BenchmarkAllowMemory/detector=true-2 	 100	 400.0 ns/op	 0 allocs/op
BenchmarkAllowMemory/detector=true-2 	 100	 600.0 ns/op	 0 allocs/op
BenchmarkDaemon/rtt=local/api=http-2 	 100	 60000 decisions/s
BenchmarkNew-2 	 100	 5.0 ns/op
`
	var out bytes.Buffer
	if err := compare(strings.NewReader(base), strings.NewReader(this), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		// Rounds pair: 400/800 and 600/1000, median 0.55 (not 500/900).
		"| BenchmarkAllowMemory/detector=true | ns/op | 900.0 | 500.0 | 0.550 |",
		"| BenchmarkAllowMemory/detector=true | allocs/op | 0 | 0 | — |",
		"| BenchmarkDaemon/rtt=local/api=http | decisions/s | 50000 | 60000 | 1.200 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	for _, absent := range []string{"BenchmarkGone", "BenchmarkNew"} {
		if strings.Contains(got, absent) {
			t.Errorf("%s is in one run only, yet reported:\n%s", absent, got)
		}
	}
	if err := compare(strings.NewReader(""), strings.NewReader(this), &out); err == nil {
		t.Error("an empty base compared without an error")
	}
}
