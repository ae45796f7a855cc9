package coordinator

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// checkConnConfig checks the connection part of a Config: either a
// connection the caller owns, or URLs and the options to dial them.
func checkConnConfig(c *Config) error {
	dialing := len(c.URLs) > 0 || c.User != "" || c.Password != "" || c.Token != "" ||
		c.NkeySeedFile != "" || c.CredsFile != "" || c.CAFile != "" || c.CertFile != "" ||
		c.KeyFile != "" || len(c.NATSOptions) > 0
	if c.Conn != nil {
		if dialing {
			return errors.New("coordinator: Config.Conn is set, so URLs, credentials, TLS files and NATSOptions must be empty (they apply only when the coordinator dials NATS itself)")
		}
		return nil
	}
	if len(c.URLs) == 0 {
		return errors.New("coordinator: Config needs Conn or at least one URL")
	}
	for _, u := range c.URLs {
		if strings.TrimSpace(u) == "" {
			return errors.New("coordinator: empty URL in Config.URLs")
		}
	}
	auth := 0
	for _, set := range []bool{c.User != "" || c.Password != "", c.Token != "", c.NkeySeedFile != "", c.CredsFile != ""} {
		if set {
			auth++
		}
	}
	if auth > 1 {
		return errors.New("coordinator: set at most one of User/Password, Token, NkeySeedFile and CredsFile")
	}
	if c.Password != "" && c.User == "" {
		return errors.New("coordinator: Config.Password needs Config.User")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("coordinator: Config.CertFile and Config.KeyFile go together")
	}
	if c.ReconnectWait < 0 || c.ConnectTimeout < 0 {
		return errors.New("coordinator: ReconnectWait and ConnectTimeout must not be negative")
	}
	return nil
}

// dialOptions returns the nats.go options for a connection the coordinator
// owns. The handlers report connection events to c.
func (c *NATS) dialOptions() ([]nats.Option, error) {
	cfg := &c.cfg
	opts := []nats.Option{
		nats.Name("hotkey " + cfg.ID),
		nats.Timeout(cfg.ConnectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		// Nothing is buffered while disconnected: publishes fail (and are
		// counted), and every own lease is published again on reconnect,
		// so no stale lease is replayed.
		nats.ReconnectBufSize(-1),
		// Own messages are not echoed back.
		nats.NoEcho(),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() { // our own Close
				return
			}
			c.st.disconnects.Add(1)
			c.log.Warn("coordinator: disconnected from NATS", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.log.Info("coordinator: reconnected to NATS", "url", redact(nc.ConnectedUrl()))
			c.wake(c.wakePub)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.st.asyncErrors.Add(1)
			c.log.Warn("coordinator: NATS error", "err", err)
		}),
	}
	auth, err := cfg.AuthOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	return append(opts, cfg.NATSOptions...), nil
}

// AuthOptions returns the nats.go options for the credentials and TLS
// files c names (User and Password, Token, NkeySeedFile or CredsFile;
// CAFile, CertFile and KeyFile), for a program that dials its own
// connection with them and passes it as Config.Conn. The only error is an
// nkey seed file that cannot be read.
func (c Config) AuthOptions() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	case c.NkeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(c.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("coordinator: nkey seed file %s: %w", c.NkeySeedFile, err)
		}
		opts = append(opts, o)
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	if c.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	return opts, nil
}

// redact hides the password of a URL with user info, for errors and logs.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	return p.Redacted()
}

func redactAll(us []string) string {
	r := make([]string, len(us))
	for i, u := range us {
		r[i] = redact(u)
	}
	return strings.Join(r, ",")
}
