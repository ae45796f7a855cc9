//go:build race

package hotkey

// raceEnabled reports whether the tests run under the race detector, which
// makes the engine 10 times slower or more: the long streams are cut short
// then.
const raceEnabled = true
