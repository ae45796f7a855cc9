package detector

import _ "unsafe" // for go:linkname

// procID returns the number of the processor (the runtime's P) the calling
// goroutine runs on, as sync.Pool finds its per-P cache. The goroutine may
// move right after; the number only picks a sketch stripe, so a stale one
// costs some cache traffic, never a count.
func procID() int {
	p := procPin()
	procUnpin()
	return p
}

// The runtime keeps these two for packages outside the standard library
// (go.dev/issue/67401).
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()
