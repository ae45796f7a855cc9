//go:build race

package detector

// raceEnabled reports whether the tests run under the race detector, which
// makes them about ten times slower: the long streams are cut short then.
const raceEnabled = true
