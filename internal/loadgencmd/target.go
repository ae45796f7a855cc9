package loadgencmd

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotkeyd/hotkey/loadgen"
)

// The APIs a target is asked in.
const (
	apiHotkeyd = "hotkeyd" // POST /v1/allow, or the NATS API
	apiPlain   = "plain"   // any HTTP endpoint: 2xx, 429
	apiEnvoy   = "envoy"   // Envoy's RateLimitService over gRPC
)

// The gRPC clients a grpc:// target is asked with.
const (
	grpcLean = "lean"    // loadgen.GRPCClient
	grpcGo   = "grpc-go" // google.golang.org/grpc's ClientConn
)

// probeKey is the key of the decision that checks the target before the
// run, kept apart from the workload's keys.
const probeKey = "loadgen:probe"

// descriptors is the repeatable --descriptor flag: each
// key=value[,key=value…] one descriptor.
type descriptors [][]loadgen.Entry

func (d *descriptors) String() string {
	var parts []string
	for _, desc := range *d {
		var es []string
		for _, e := range desc {
			es = append(es, e.Key+"="+e.Value)
		}
		parts = append(parts, strings.Join(es, ","))
	}
	return strings.Join(parts, " ")
}

func (d *descriptors) Set(v string) error {
	var desc []loadgen.Entry
	for item := range strings.SplitSeq(v, ",") {
		k, val, ok := strings.Cut(item, "=")
		if !ok || k == "" || val == "" {
			return fmt.Errorf("%q: want key=value[,key=value…], each key and value non-empty, e.g. user=%s", v, loadgen.KeyPlaceholder)
		}
		desc = append(desc, loadgen.Entry{Key: k, Value: val})
	}
	*d = append(*d, desc)
	return nil
}

// checkTarget checks the flags that say what the target is and how it is
// asked; set holds the flags given.
func (c *config) checkTarget(set map[string]bool) error {
	u, err := url.Parse(c.target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("--target %q: want http(s)://host:port[/path], nats://host:port or grpc(s)://host:port", c.target)
	}
	switch u.Scheme {
	case "http", "https":
		switch {
		case !set["api"] && u.Path != "" && u.Path != "/":
			return fmt.Errorf("--target %q has a path: for any HTTP endpoint (2xx admitted, 429 denied) give --api plain; for a hotkeyd under a prefix, --api hotkeyd", c.target)
		case c.api != apiHotkeyd && c.api != apiPlain:
			return fmt.Errorf("--api %q: want hotkeyd (its POST /v1/allow) or plain (any HTTP endpoint)", c.api)
		}
	case "nats":
		if set["api"] && c.api != apiHotkeyd {
			return fmt.Errorf("--api %s: a nats:// target is hotkeyd's NATS API", c.api)
		}
	case "grpc", "grpcs":
		if set["api"] && c.api != apiEnvoy {
			return fmt.Errorf("--api %s: a %s:// target is Envoy's rate-limit service (--api envoy)", c.api, u.Scheme)
		}
		if u.Path != "" && u.Path != "/" {
			return fmt.Errorf("--target %q: want grpc://host:port, without a path", c.target)
		}
		c.api = apiEnvoy
		switch {
		case c.domain == "":
			return fmt.Errorf("--domain: a %s:// target asks in a rate-limit domain: give the domain of the service's rules, e.g. --domain edge", u.Scheme)
		case len(c.descriptors) == 0:
			return fmt.Errorf("--descriptor: a %s:// target needs at least one descriptor, e.g. --descriptor user=%s", u.Scheme, loadgen.KeyPlaceholder)
		case c.cost > math.MaxUint32:
			return fmt.Errorf("--cost %d: hits_addend holds at most %d", c.cost, uint32(math.MaxUint32))
		case c.grpcClient != grpcLean && c.grpcClient != grpcGo:
			return fmt.Errorf("--grpc-client %q: want lean (loadgen's own client) or grpc-go (google.golang.org/grpc's)", c.grpcClient)
		}
	default:
		return fmt.Errorf("--target %q: want http(s)://host:port[/path], nats://host:port or grpc(s)://host:port", c.target)
	}
	// A flag of one API given for another is a mistake, not a no-op.
	for _, f := range []struct{ name, api, of string }{
		{"policy", apiHotkeyd, "names a hotkeyd policy"},
		{"domain", apiEnvoy, "is a grpc:// target's"},
		{"descriptor", apiEnvoy, "is a grpc:// target's"},
		{"grpc-client", apiEnvoy, "is a grpc:// target's"},
		{"method", apiPlain, "is --api plain's"},
		{"key-header", apiPlain, "is --api plain's"},
		{"key-param", apiPlain, "is --api plain's"},
	} {
		if set[f.name] && c.api != f.api {
			return fmt.Errorf("--%s %s: it does not apply to %s (--api %s)", f.name, f.of, c.target, c.api)
		}
	}
	if c.api == apiPlain {
		switch {
		case c.cost != 1:
			return fmt.Errorf("--cost %d: an HTTP endpoint is sent one request a decision, of no cost", c.cost)
		case c.method == "" || strings.ContainsFunc(c.method, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, r) }):
			return fmt.Errorf("--method %q: want an HTTP method, e.g. GET or POST", c.method)
		}
	}
	return nil
}

// connect returns the target c names, and what closes it.
func (c config) connect() (loadgen.Target, func(), error) {
	u, _ := url.Parse(c.target) // checked by parse
	switch {
	case u.Scheme == "nats":
		nc, err := nats.Connect(c.target, nats.Name("hotkeyd loadgen"), nats.Timeout(5*time.Second))
		if err != nil {
			return nil, nil, fmt.Errorf("connect to NATS at %s: %w", c.target, err)
		}
		return loadgen.NATSNamespace(nc, c.namespace, c.policy), nc.Close, nil
	case c.api == apiEnvoy && c.grpcClient == grpcGo:
		creds := insecure.NewCredentials()
		if u.Scheme == "grpcs" {
			creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
		}
		conn, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, nil, fmt.Errorf("gRPC client for %s: %w", c.target, err)
		}
		return loadgen.Envoy(conn, c.domain, c.descriptors), func() { conn.Close() }, nil
	case c.api == apiEnvoy:
		var tlsConf *tls.Config
		if u.Scheme == "grpcs" {
			tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := loadgen.DialGRPCClient(ctx, u.Host, tlsConf)
		if err != nil {
			return nil, nil, fmt.Errorf("connect to %s: %w", c.target, err)
		}
		return loadgen.Envoy(conn, c.domain, c.descriptors), func() { conn.Close() }, nil
	case c.api == apiPlain:
		t, err := loadgen.Endpoint(c.target, loadgen.EndpointConfig{Method: c.method, KeyHeader: c.keyHeader, KeyParam: c.keyParam})
		if err != nil {
			return nil, nil, err
		}
		return t, func() {}, nil
	}
	return loadgen.HTTP(c.target, c.policy, nil), func() {}, nil
}
