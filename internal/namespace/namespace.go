// Package namespace names what a hotkeyd fleet of a namespace (--namespace)
// is asked on over NATS, for the daemons that answer and the clients that ask
// (hotkeyd loadgen) alike: fleets that share a NATS with namespaces of their
// own hear only their own.
package namespace

import "github.com/hotkeyd/hotkey/coordinator"

const (
	// Default is the namespace of a daemon without --namespace.
	Default = coordinator.DefaultNamespace
	// Max bounds a namespace's length, as the coordinator bounds a subject
	// token.
	Max = 64
	// DefaultAllowSubject is the decision subject of the default namespace.
	DefaultAllowSubject = "hotkey.allow"
)

// Valid reports whether ns is 1 to Max of A-Z a-z 0-9 - _: one NATS subject
// token, and a part of a micro service name.
func Valid(ns string) bool {
	if ns == "" || len(ns) > Max {
		return false
	}
	for _, c := range []byte(ns) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// AllowSubject returns the subject decisions are asked on in namespace ns:
// DefaultAllowSubject (hotkey.allow) in the default namespace,
// hotkey.<ns>.api.allow in others, which no coordinator's hotkey.<ns>.*
// matches.
func AllowSubject(ns string) string {
	if ns == Default {
		return DefaultAllowSubject
	}
	return "hotkey." + ns + ".api.allow"
}
