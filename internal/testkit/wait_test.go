package testkit

import (
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	n := 0
	took := For(t, time.Minute, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 || took < 0 {
		t.Fatalf("polled %d times, took %v; want 3 polls", n, took)
	}
}

// fatal records a Fatalf instead of ending the test.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = format
	panic(f)
}

func TestForGivesUp(t *testing.T) {
	f := &fatal{TB: t}
	defer func() {
		if r := recover(); r != f || f.msg == "" {
			t.Fatalf("recovered %v; want the Fatalf of a wait that gave up", r)
		}
	}()
	For(f, 10*time.Millisecond, "never", func() bool { return false })
	t.Fatal("For returned for a condition that never holds")
}
