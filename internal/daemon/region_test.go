package daemon

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestRegionFlags: --region is one NATS subject token and names the
// embedded cluster unless --nats-cluster-name does; the gateway flags are
// refused with --nats and --nats none, without a gateway listener or a
// region, with a cluster named apart from the region, off loopback without
// credentials, and when malformed.
func TestRegionFlags(t *testing.T) {
	const gw = "127.0.0.1:7222"
	for _, c := range []struct {
		give []string
		env  map[string]string
		want string // in the error; empty: accepted
	}{
		{give: []string{"--region", "eu-west_1"}},
		{give: []string{"--nats", "none", "--region", "eu"}},
		{give: []string{"--nats", "nats://x:4222", "--region", "eu"}},
		{give: []string{"--region", "eu", "--nats-cluster-listen", "127.0.0.1:6222", "--nats-cluster-name", "fleet"}},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-cluster-name", "eu"}},
		{give: []string{"--region", "eu", "--nats-gateway-listen", "0.0.0.0:7222", "--nats-token", "tok"}},
		{give: []string{"--region", "eu", "--nats-gateway-listen", ":7222", "--nats-user", "u"}, env: map[string]string{"HOTKEYD_NATS_PASSWORD": "pw"}},
		{give: []string{"--region", ""}, want: `--region (HOTKEYD_REGION) "": want 1 to 64 of A-Z a-z 0-9 - _`},
		{give: []string{"--region", "eu.west"}, want: `--region (HOTKEYD_REGION) "eu.west": want 1 to 64`},
		{give: []string{"--region", strings.Repeat("r", 65)}, want: "--region (HOTKEYD_REGION)"},
		{env: map[string]string{"HOTKEYD_REGION": "eu west"}, want: `--region (HOTKEYD_REGION) "eu west"`},
		{give: []string{"--nats", "nats://x:4222", "--nats-gateway-listen", gw}, want: "--nats-gateway-listen (HOTKEYD_NATS_GATEWAY_LISTEN) is for the embedded NATS server, which --nats (HOTKEYD_NATS) replaces"},
		{give: []string{"--nats", "nats://x:4222", "--nats-gateways", "us=h:7222"}, want: "--nats-gateways (HOTKEYD_NATS_GATEWAYS) is for the embedded NATS server"},
		{give: []string{"--nats", "none", "--nats-gateway-listen", gw}, want: "--nats-gateway-listen (HOTKEYD_NATS_GATEWAY_LISTEN) applies to NATS, which --nats (HOTKEYD_NATS) none turns off"},
		{give: []string{"--nats", "none"}, env: map[string]string{"HOTKEYD_NATS_GATEWAYS": "us=h:7222"}, want: "--nats-gateways (HOTKEYD_NATS_GATEWAYS) applies to NATS"},
		{give: []string{"--nats-gateway-listen", gw}, want: "--nats-gateway-listen (HOTKEYD_NATS_GATEWAY_LISTEN) needs --region (HOTKEYD_REGION)"},
		{give: []string{"--region", "eu", "--nats-gateways", "us=h:7222"}, want: "--nats-gateways (HOTKEYD_NATS_GATEWAYS) needs --nats-gateway-listen"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-cluster-name", "fleet"}, want: `--nats-cluster-name (HOTKEYD_NATS_CLUSTER_NAME) "fleet" is not --region (HOTKEYD_REGION) "eu"`},
		{give: []string{"--region", "eu", "--nats-gateway-listen", "7222"}, want: "--nats-gateway-listen (HOTKEYD_NATS_GATEWAY_LISTEN) \"7222\": want host:port"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", ":7222"}, want: "any host that reaches it could join the regions' NATS supercluster"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", "10.0.0.5:7222", "--nats-user", "u"}, want: "add --nats-user (HOTKEYD_NATS_USER) and --nats-password (HOTKEYD_NATS_PASSWORD), or --nats-token (HOTKEYD_NATS_TOKEN)"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "eu=h:7222"}, want: "region eu is this daemon's own --region"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "us"}, want: `--nats-gateways (HOTKEYD_NATS_GATEWAYS) "us": want REGION=URL[,URL...]`},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "us="}, want: "want REGION=URL"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "=h:7222"}, want: "want REGION=URL"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "u.s=h:7222"}, want: `region "u.s": want 1 to 64`},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "us=http://h:7222"}, want: `scheme "http"`},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "us=h"}, want: "want nats://host:port or host:port"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "us=nats://u:s3cret@h:7222"}, want: "nats://u:xxxxx@h:7222\": no credentials in a gateway URL"},
		{give: []string{"--region", "eu", "--nats-gateway-listen", gw, "--nats-gateways", "us=h:7222;us=h:7223"}, want: "region us given twice"},
		{give: []string{"--region", "eu", "--regions", "eu,us,ap", "--region-interval", "250ms"}},
		{give: []string{"--regions", "eu,us"}, want: "--regions (HOTKEYD_REGIONS) needs --region (HOTKEYD_REGION)"},
		{give: []string{"--region", "eu", "--regions", "us,ap"}, want: "--regions (HOTKEYD_REGIONS) us,ap lacks this daemon's --region (HOTKEYD_REGION) eu"},
		{give: []string{"--region", "eu", "--regions", "eu"}, want: "want this region and at least one other"},
		{give: []string{"--region", "eu", "--regions", "eu,us,eu"}, want: "region eu given twice"},
		{give: []string{"--region", "eu", "--regions", "eu,u.s"}, want: `region "u.s": want 1 to 64`},
		{give: []string{"--region", "eu", "--regions", ","}, want: "--regions (HOTKEYD_REGIONS) is empty"},
		{give: []string{"--region-interval", "5ms"}, want: "--region-interval (HOTKEYD_REGION_INTERVAL) 5ms: want a duration from 10ms to 1m0s"},
		{give: []string{"--nats", "none", "--region", "eu", "--regions", "eu,us"}, want: "--regions (HOTKEYD_REGIONS) is for the exchange between regions over NATS, which --nats (HOTKEYD_NATS) none turns off"},
	} {
		cfg, err := ParseArgs(c.give, env(c.env), nil)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v %v: %v, want it accepted", c.give, c.env, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v %v: err %v, want it to mention %q", c.give, c.env, err, c.want)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%v: the password is in the error: %v", c.give, err)
		case c.want == "" && slices.Contains(c.give, "--region") && !slices.Contains(c.give, "--nats-cluster-name") && cfg.NATSClusterName != cfg.Region:
			t.Errorf("%v: cluster name %q, want the region %q", c.give, cfg.NATSClusterName, cfg.Region)
		}
	}

	// The gateways: entries separated by ';', or the flag repeated, or
	// both; in the environment, by ';'.
	want := []NATSGateway{{"us", []string{"a:7222"}}, {"ap", []string{"nats://b:7222", "c:7222"}}, {"sa", []string{"d:7222"}}}
	for _, c := range []struct {
		give []string
		env  map[string]string
	}{
		{give: []string{"--nats-gateways", "us=a:7222; ap=nats://b:7222, c:7222;sa=d:7222;"}},
		{give: []string{"--nats-gateways", "us=a:7222", "--nats-gateways", "ap=nats://b:7222,c:7222;sa=d:7222"}},
		{env: map[string]string{"HOTKEYD_NATS_GATEWAYS": "us=a:7222;ap=nats://b:7222,c:7222;sa=d:7222"}},
	} {
		args := append([]string{"--region", "eu", "--nats-gateway-listen", gw}, c.give...)
		cfg, err := ParseArgs(args, env(c.env), nil)
		if err != nil {
			t.Errorf("%v %v: %v", c.give, c.env, err)
			continue
		}
		if !slices.EqualFunc(cfg.NATSGateways, want, func(a, b NATSGateway) bool { return a.Region == b.Region && slices.Equal(a.URLs, b.URLs) }) {
			t.Errorf("%v %v: gateways %+v, want %+v", c.give, c.env, cfg.NATSGateways, want)
		}
		if regions := []string{"eu", "us", "ap", "sa"}; !slices.Equal(cfg.Regions, regions) {
			t.Errorf("%v %v: --regions by default %v, want this region and the gateways' %v", c.give, c.env, cfg.Regions, regions)
		}
	}
}

// TestSupercluster: two regions, each a daemon with its embedded NATS,
// join one NATS supercluster through their own gateway flags (the
// gateways logging in with the token): a request made in one region is
// answered by a subscriber in the other. The daemons of the two regions,
// in one namespace, do not count each other; each reports its region; a
// gateway listed but down is named in /readyz's warnings. Under a policy
// with regions: exchange, what one region admits is charged in the other.
func TestSupercluster(t *testing.T) {
	const token = "s3cret-gateway-token"
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(policies, []byte("policies:\n  x:\n    algorithm: fixed_window\n    limit: 10\n    period: 24h\n    regions: exchange\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--nats-listen", "127.0.0.1:0", "--nats-gateway-listen", "127.0.0.1:0", "--nats-token", token, "--policies", policies, "--region-interval", "50ms"}
	var euLogs, usLogs testkit.Buffer
	eu, err := startLogged(t, &euLogs, nil, append(base, "--region", "eu", "--regions", "eu,us,ap")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, eu) })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	gateways := "eu=" + eu.ns.Server().GatewayAddr().String() + ";ap=" + deadAddr
	us, err := startLogged(t, &usLogs, nil, append(base, "--region", "us", "--nats-gateways", gateways)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, us) })
	testkit.For(t, time.Minute, "the gateways between eu and us", func() bool {
		return eu.ns.Server().NumOutboundGateways() == 1 && slices.Equal(us.gatewaysDown(), []string{"ap"})
	})

	connect := func(d *Daemon) *nats.Conn {
		nc, err := nats.Connect(d.NATSURL(), nats.Token(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	euc, usc := connect(eu), connect(us)
	if _, err := euc.Subscribe("region.echo", func(m *nats.Msg) { m.Respond(append([]byte("eu:"), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	if err := euc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Interest crosses the gateway asynchronously: ask until answered.
	testkit.For(t, time.Minute, "a request made in us answered in eu", func() bool {
		m, err := usc.Request("region.echo", []byte("hi"), time.Second)
		return err == nil && string(m.Data) == "eu:hi"
	})

	// eu's heartbeats reach us, on eu's subjects: three of them heard in us
	// leave us's coordinator no excuse had it listened to them.
	beats, err := usc.SubscribeSync("hotkey.default.eu.hb")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := beats.NextMsg(time.Minute); err != nil {
			t.Fatalf("eu's heartbeat %d not heard in us: %v", i+1, err)
		}
	}
	for _, d := range []*Daemon{eu, us} {
		if n := d.engine.Stats().Instances; n != 1 {
			t.Errorf("daemon %s counts %d instances, want 1: the other region's daemon is not its peer", d.ID(), n)
		}
	}

	for _, c := range []struct {
		d      *Daemon
		region string
		logs   *testkit.Buffer
	}{{eu, "eu", &euLogs}, {us, "us", &usLogs}} {
		if got := c.d.engine.Stats().Region; got != c.region {
			t.Errorf("Stats().Region %q, want %q", got, c.region)
		}
		if m := scrapeMetrics(t, c.d); !strings.Contains(m, `hotkey_region_info{region="`+c.region+`"} 1`) {
			t.Errorf("%s: /metrics has no hotkey_region_info{region=%q} 1", c.region, c.region)
		}
		logs := c.logs.String()
		if !strings.Contains(logs, "region="+c.region) || !strings.Contains(logs, "gateway "+c.region+" on 127.0.0.1:") || strings.Contains(logs, token) {
			t.Errorf("%s: the serving log must name the region and the gateway, and not the token:\n%s", c.region, logs)
		}
	}
	if w := strings.Join(us.warnings(), "\n"); !strings.Contains(w, "no gateway of the embedded NATS server is up to region ap of --nats-gateways") || strings.Contains(w, "region eu") {
		t.Errorf("us's /readyz warnings: %q, want region ap's gateway named down, and not eu's", w)
	}
	if w := eu.warnings(); len(w) != 0 {
		t.Errorf("eu's /readyz warnings: %q, want none (it lists no gateway)", w)
	}

	// regions: exchange: eu admits 6 of 10 in a day; us, charged them,
	// admits the 4 left.
	for i := range 6 {
		if code := allow(t, eu, `{"key":"k","policy":"x"}`); code != http.StatusOK {
			t.Fatalf("eu's decision %d: %d", i, code)
		}
	}
	testkit.For(t, time.Minute, "eu's 6 charged in us", func() bool {
		st, _ := us.engine.RegionStats()
		return st.Charged["eu"] == 6
	})
	admitted := 0
	for range 10 {
		if allow(t, us, `{"key":"k","policy":"x"}`) == http.StatusOK {
			admitted++
		}
	}
	if admitted != 4 {
		t.Errorf("us admitted %d after eu's 6 of 10, want 4", admitted)
	}
	if m := scrapeMetrics(t, us); !strings.Contains(m, `hotkey_region_units_total{direction="charged",region="eu"} 6`) {
		t.Errorf("us's /metrics lacks eu's 6 units charged")
	}
	resp, err := http.Get("http://" + eu.AdminAddr() + "/v1/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"name":"x"`) || !strings.Contains(string(body), `"regions":"exchange"`) {
		t.Errorf("/v1/config does not say x's regions: %s", body)
	}
}

// TestGatewayListenWarn: a gateway port on loopback without credentials is
// let through with a warning that names the flags to add; with them, there
// is no warning.
func TestGatewayListenWarn(t *testing.T) {
	const warning = "accepts gateways without authentication"
	for _, c := range []struct {
		give []string
		want bool // warned
	}{
		{nil, true},
		{[]string{"--nats-token", "s3cret-token"}, false},
	} {
		var logs testkit.Buffer
		d, err := startLogged(t, &logs, nil, append([]string{"--nats-listen", "127.0.0.1:0", "--region", "eu", "--nats-gateway-listen", "127.0.0.1:0"}, c.give...)...)
		if err != nil {
			t.Fatal(err)
		}
		shutdown(t, d)
		out := logs.String()
		if got := strings.Contains(out, warning); got != c.want {
			t.Errorf("%v: warned %v, want %v; log:\n%s", c.give, got, c.want, out)
		} else if got && (!strings.Contains(out, "level=WARN") || !strings.Contains(out, "--nats-token (HOTKEYD_NATS_TOKEN)") || !strings.Contains(out, "gateway=127.0.0.1:")) {
			t.Errorf("%v: the warning must be a WARN naming the flags to add and the gateway address; log:\n%s", c.give, out)
		}
		if strings.Contains(out, "s3cret-token") {
			t.Errorf("%v: the token is in the log", c.give)
		}
	}
}
