// Package yamlerr makes the errors of files read with gopkg.in/yaml.v3
// name the line at fault and describe what was found, for the daemon's
// policies file and Envoy rules files alike.
package yamlerr

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Error is a file refused: File is the file at fault (empty for data not
// read from one), Line the line (1-based, 0 when the file as a whole is),
// Field the path of the field ("policies.login.period",
// "descriptors[1].rate_limit.unit").
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error reads "FILE: line N: FIELD: MSG", without the parts that are empty.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// maxScanLines and maxScanBytes bound the files Locate scans for the line
// at fault (it parses prefixes).
const (
	maxScanLines = 500
	maxScanBytes = 64 << 10
)

// Locate splits a YAML syntax error of data into its line and message.
// yaml.v3 names the line where the enclosing block starts; the line at
// fault is the first whose inclusion makes the same error appear, which is
// found for files of up to 500 lines and 64 KiB. It parses prefixes line
// by line up from the end while they come to at most 4 times the file's
// size and 8 KiB, then bisects, so that its cost is linear in the file's
// size.
func Locate(data []byte, err error) (line int, msg string) {
	line, msg = split(err)
	if l := faultLine(data, msg); l > 0 {
		line = l
	}
	return line, msg
}

// faultLine returns the line at fault for a YAML error msg: the first line
// n such that the first n lines, and every longer prefix, fail with msg
// (an earlier prefix may fail only for being cut short, inside a flow list
// that a later line closes; bisection, past the budget, may then stop at
// such a prefix). 0 if not found.
func faultLine(data []byte, msg string) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > maxScanLines || len(data) > maxScanBytes {
		return 0
	}
	ends := make([]int, len(lines))
	end := 0
	for i, l := range lines {
		end += len(l)
		ends[i] = end
	}
	fails := func(n int) bool { // the first n lines fail with msg
		dec := yaml.NewDecoder(bytes.NewReader(data[:ends[n-1]]))
		for {
			var doc yaml.Node
			err := dec.Decode(&doc)
			switch {
			case err == nil:
				continue
			case errors.Is(err, io.EOF):
				return false
			}
			_, m := split(err)
			return m == msg
		}
	}
	n := len(lines)
	if !fails(n) {
		return 0
	}
	parsed, budget := 0, 4*len(data)+8<<10
	for n > 1 && parsed+ends[n-2] <= budget {
		parsed += ends[n-2]
		if !fails(n - 1) {
			return n
		}
		n--
	}
	lo, hi := 1, n // fails(hi), and lo is 1 or !fails(lo-1)
	for lo < hi {
		if mid := (lo + hi) / 2; fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return hi
}

// split splits yaml.v3's "yaml: line N: msg".
func split(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				return n, strings.TrimSpace(rest[i+1:])
			}
		}
	}
	return 0, msg
}

// MaxField and MaxMsg bound the Field and Msg of an Error made by New.
const (
	MaxField = 200
	MaxMsg   = 400
)

// New returns an Error whose Field and Msg are cut to MaxField and MaxMsg
// bytes: a field over MaxField keeps its start and its end, so that an
// error about a deep or long-named field stays short.
func New(file string, line int, field, msg string) *Error {
	if len(field) > MaxField {
		head := Truncate(field, MaxField/2-1)
		tail := field[len(field)-(MaxField/2-2):]
		for len(tail) > 0 && tail[0]&0xC0 == 0x80 {
			tail = tail[1:]
		}
		field = head + tail
	}
	return &Error{File: file, Line: line, Field: field, Msg: Truncate(msg, MaxMsg)}
}

// Quote quotes s for a message as %q does, cut to 64 bytes first.
func Quote(s string) string { return strconv.Quote(Truncate(s, 64)) }

// KindName describes a node for errors: "a mapping", "a list", "nothing",
// the text "…", and so on.
func KindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!str":
			return fmt.Sprintf("the text %q", Truncate(n.Value, 40))
		}
		return fmt.Sprintf("%q", Truncate(n.Value, 40))
	}
	return "an unexpected value"
}

// Truncate shortens s to at most n bytes (cut on a rune boundary), and
// marks the cut with "…", for messages.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
