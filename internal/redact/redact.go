// Package redact hides the passwords of URLs, for logs and errors.
package redact

import (
	"net/url"
	"strings"
)

// URL returns u with the password of its user info, if any, replaced by
// "xxxxx", and for a NATS URL (nats, tls, ws, wss) a user without a
// password too, since NATS reads it as a token; a string that does not
// parse as a URL, or has no user info, is returned as it is.
func URL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	if _, ok := p.User.Password(); !ok {
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
			p.User = url.User("xxxxx")
			return p.String()
		}
		return u
	}
	return p.Redacted()
}

// URLs returns the URLs of us, each through URL (blanks around each
// trimmed), joined by commas.
func URLs(us []string) string {
	r := make([]string, len(us))
	for i, u := range us {
		r[i] = URL(strings.TrimSpace(u))
	}
	return strings.Join(r, ",")
}
