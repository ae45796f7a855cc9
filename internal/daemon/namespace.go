// The names a daemon uses on NATS, by namespace: fleets that share a NATS
// with namespaces of their own hear and answer only their own.

package daemon

import "github.com/hotkeyd/hotkey/coordinator"

// serviceName returns the micro service's name in namespace ns, which names
// its discovery subjects ($SRV.PING.<name> and the like): ServiceName in
// the default namespace, ServiceName-<ns> in others.
func serviceName(ns string) string {
	if ns == coordinator.DefaultNamespace {
		return ServiceName
	}
	return ServiceName + "-" + ns
}

// inboxPrefix returns the daemons' inbox prefix in namespace ns, "" for
// nats.go's _INBOX: daemonInboxPrefix when API clients, who may subscribe
// to _INBOX.>, share the server (clientUser), and daemonInboxPrefix.<ns>
// in any namespace but the default, so that a fleet's sync replies stay
// under a prefix of its own.
func inboxPrefix(ns string, clientUser bool) string {
	switch {
	case ns != coordinator.DefaultNamespace:
		return daemonInboxPrefix + "." + ns
	case clientUser:
		return daemonInboxPrefix
	}
	return ""
}
