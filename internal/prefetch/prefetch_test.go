package prefetch

import (
	"testing"
	"unsafe"
)

// TestLine: a hint on a live address, on nil and on an address nothing is
// mapped at changes nothing and does not fault.
func TestLine(t *testing.T) {
	b := make([]byte, 4096)
	b[100] = 7
	Line(uintptr(unsafe.Pointer(&b[100])))
	Line(0)
	Line(^uintptr(0) &^ 63)
	if b[100] != 7 {
		t.Fatalf("byte changed to %d", b[100])
	}
}
