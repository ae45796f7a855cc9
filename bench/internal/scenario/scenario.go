// Package scenario holds what the benchmark report's programs share
// (bench/report, and bench/peers, which is apart for gubernator's
// dependencies): a section of the report, and closed-loop throughput.
package scenario

import (
	"fmt"
	"os"
	"strings"
)

// Section is a scenario's part of docs/benchmarks.md.
type Section struct {
	Title string
	Setup string // what ran: instances, store, load, run length
	Body  strings.Builder
}

// Printf adds to the section's body.
func (s *Section) Printf(format string, args ...any) { fmt.Fprintf(&s.Body, format, args...) }

// Markdown returns the section, stating how long it took to measure.
func (s *Section) Markdown(tookSeconds float64) string {
	return fmt.Sprintf("\n### %s\n\n*Setup:* %s Took %.0f s.\n\n%s", s.Title, s.Setup, tookSeconds, s.Body.String())
}

// Append adds text to the file md, or writes it to stdout if md is empty.
func Append(md, text string) error {
	if md == "" {
		_, err := os.Stdout.WriteString(text)
		return err
	}
	f, err := os.OpenFile(md, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
