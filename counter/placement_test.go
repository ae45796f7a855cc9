package counter

import (
	"context"
	"fmt"
	"github.com/hotkeyd/hotkey/shard"
	"hash/crc32"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/redistest"
)

func TestCRC16(t *testing.T) {
	for _, tt := range []struct {
		give string
		want uint16
	}{
		{"", 0},
		{"123456789", 0x31c3}, // the Redis Cluster specification's check value
		{"a", 0x7c87},
	} {
		if got := crc16(0, tt.give); got != tt.want {
			t.Errorf("crc16(%q) = %#04x, want %#04x", tt.give, got, tt.want)
		}
	}
	// Continuing a crc equals hashing the concatenation.
	if a, b := crc16(crc16(0, "hk:"), "user"), crc16(0, "hk:user"); a != b {
		t.Errorf("crc16 continued = %#04x, whole = %#04x", a, b)
	}
}

// slotCases are keys with and without hash tags, whose slots are checked
// against the Redis docs and CLUSTER KEYSLOT.
var slotCases = []struct {
	prefix, name string
	want         int // -1: only compared with CLUSTER KEYSLOT
}{
	{"", "foo", 12182},
	{"", "bar", 5061},
	{"", "somekey", 11058},
	{"", "foo{hash_tag}", 2515},
	{"", "{user1000}.following", -1},
	{"", "{user1000}.followers", -1},
	{"", "foo{}{bar}", -1},    // empty tag: the whole key
	{"", "foo{{bar}}zap", -1}, // tag "{bar"
	{"", "foo{bar}{zap}", -1}, // tag "bar"
	{"", "{bar", -1},          // no closing brace
	{"hk:", "x", -1},
	{"hk:", "user{42}:a", -1},
	{"hk:", "user{42}:b", -1},
	{"prefix:", "", -1},
}

func TestKeySlot(t *testing.T) {
	checkLeaks(t)
	c := newTestClient(t, testClusterAddrs[0])
	for _, tt := range slotCases {
		got := keySlot(tt.prefix, tt.name)
		if tt.want >= 0 && got != tt.want {
			t.Errorf("keySlot(%q, %q) = %d, want %d", tt.prefix, tt.name, got, tt.want)
		}
		want, err := c.ClusterKeySlot(context.Background(), tt.prefix+tt.name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got != int(want) {
			t.Errorf("keySlot(%q, %q) = %d, CLUSTER KEYSLOT says %d", tt.prefix, tt.name, got, want)
		}
	}
	for i := range 200 {
		key := fmt.Sprintf("key:%d:%x", i, i*2654435761)
		want, err := c.ClusterKeySlot(context.Background(), "hk:"+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot("hk:", key); got != int(want) {
			t.Errorf("keySlot(hk:, %q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}
}

func TestHashTag(t *testing.T) {
	for _, tt := range []struct {
		give, want string
		ok         bool
	}{
		{"abc", "", false},
		{"a{b}c", "b", true},
		{"a{}c{d}", "", false},
		{"{{b}}", "{b", true},
		{"a{b", "", false},
		{"a}b{c}", "c", true},
	} {
		if got, ok := shard.HashTag(tt.give); got != tt.want || ok != tt.ok {
			t.Errorf("shard.HashTag(%q) = %q, %v; want %q, %v", tt.give, got, ok, tt.want, tt.ok)
		}
	}
}

func TestSingleNodePlacement(t *testing.T) {
	checkLeaks(t)
	s := newTestStore(t, newTestClient(t, testRedisAddr), RedisConfig{})
	p := s.Placement()
	if p.Nodes() != 1 || p.Node("anything") != 0 || p.Version() == 0 {
		t.Errorf("placement: %d nodes, Node = %d, version %d; want 1 node", p.Nodes(), p.Node("anything"), p.Version())
	}
}

// TestClusterPlacement checks the slot map against the cluster itself:
// CLUSTER SLOTS ownership, and where the store's keys actually land.
func TestClusterPlacement(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})
	t.Cleanup(func() { client.Close() })
	sent := &cmdRecorder{}
	client.AddHook(sent)
	s := newTestStore(t, client, RedisConfig{RefreshInterval: 10 * time.Millisecond})
	p := s.Placement()
	if p.Nodes() != 3 {
		t.Fatalf("Nodes() = %d, want 3", p.Nodes())
	}
	masters := slices.Sorted(slices.Values(testClusterAddrs))
	direct := make([]*redis.Client, len(masters))
	for i, addr := range masters {
		direct[i] = newTestClient(t, addr)
	}
	owner := map[int64]int{} // slot → index in masters, from CLUSTER SLOTS
	ranges, err := direct[0].ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		for slot := r.Start; slot <= r.End; slot++ {
			owner[int64(slot)] = slices.Index(masters, r.Nodes[0].Addr)
		}
	}

	base := testKey(t)
	perNode := make([]int, p.Nodes())
	for i := range 300 {
		name := base + strconv.Itoa(i)
		node := p.Node(name)
		perNode[node]++
		slot, err := direct[0].ClusterKeySlot(ctx, "hk:"+name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if node != owner[slot] {
			t.Fatalf("Node(%q) = %d, but slot %d belongs to %s", name, node, slot, masters[owner[slot]])
		}
		mustTake(t, s, name, Limit{Algorithm: Algorithm(i) % numAlgorithms, Rate: 10, Period: longPeriod}, 1)
		// The owner has the key; the others redirect to it.
		for j, c := range direct {
			n, err := c.Exists(ctx, "hk:"+name).Result()
			switch {
			case j == node && (err != nil || n != 1):
				t.Fatalf("key %q not on node %d (%s): %d, %v", name, node, masters[node], n, err)
			case j != node && !redis.HasErrorPrefix(err, "MOVED"):
				t.Fatalf("node %d (%s) answers EXISTS %q with %d, %v; want MOVED", j, masters[j], name, n, err)
			}
		}
	}
	for i, n := range perNode {
		if n < 50 {
			t.Errorf("node %d holds %d of 300 keys: %v", i, n, perNode)
		}
	}
	// The refresher re-reads an unchanged map without a new version. Each
	// refresh ends with a TIME (the clock skew): two TIMEs from now on mean
	// at least one whole refresh.
	sent.reset()
	for deadline := time.Now().Add(time.Minute); sent.count("time") < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no refresh in a minute")
		}
	}
	if v := s.Placement().Version(); v != p.Version() {
		t.Errorf("version changed from %d to %d with the same map", p.Version(), v)
	}
}

// TestClusterPlacementRefresh moves a slot to another master and checks
// that the store publishes a new snapshot that follows it.
func TestClusterPlacementRefresh(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	cluster, err := redistest.StartCluster(testDir, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Close() })
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { client.Close() })
	s := newTestStore(t, client, RedisConfig{RefreshInterval: 10 * time.Millisecond})
	p := s.Placement()
	masters := slices.Sorted(slices.Values(cluster.Addrs))
	name := testKey(t)
	slot, from := keySlot("hk:", name), p.Node(name)
	to := (from + 1) % len(masters)
	ids := make([]string, len(masters))
	for i, addr := range masters {
		if ids[i], err = newTestClient(t, addr).ClusterMyID(ctx).Result(); err != nil {
			t.Fatal(err)
		}
	}
	// Move the (empty) slot: importing, migrating, then assign it everywhere,
	// the new owner first so it bumps its epoch.
	steps := []struct {
		node int
		args []any
	}{
		{to, []any{"CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]}},
		{from, []any{"CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]}},
		{to, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[to]}},
		{from, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[to]}},
		{3 - from - to, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[to]}},
	}
	for _, st := range steps {
		if err := newTestClient(t, masters[st.node]).Do(ctx, st.args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", st.args, masters[st.node], err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for s.Placement().Node(name) != to {
		if time.Now().After(deadline) {
			t.Fatalf("Node(%q) still %d after its slot moved to %d", name, s.Placement().Node(name), to)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := s.Placement().Version(); v <= p.Version() {
		t.Errorf("version %d after the map changed, was %d", v, p.Version())
	}
	mustTake(t, s, name, Limit{Rate: 10, Period: longPeriod}, 1)
	if n, err := newTestClient(t, masters[to]).Exists(ctx, "hk:"+name).Result(); err != nil || n != 1 {
		t.Errorf("key not on the slot's new owner: %d, %v", n, err)
	}
}

// TestRingPlacement checks that Node agrees with the shard that actually
// receives each key, for go-redis's default hash, a custom one, and after a
// shard goes down.
func TestRingPlacement(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	other := startOwnServer(t)
	addrs := map[string]string{"shard-a": testRedisAddr, "shard-b": other.Addr}
	names := []string{"shard-a", "shard-b"}
	direct := []*redis.Client{newTestClient(t, testRedisAddr), newTestClient(t, other.Addr)}

	// check takes on 200 keys and checks where each one landed.
	check := func(t *testing.T, ring *redis.Ring, s *RedisStore) {
		t.Helper()
		p := s.Placement()
		if p.Nodes() != 2 {
			t.Fatalf("Nodes() = %d, want 2", p.Nodes())
		}
		base := testKey(t)
		perNode := make([]int, 2)
		for i := range 200 {
			name := base + strconv.Itoa(i)
			if i%10 == 0 {
				name = "{tag" + strconv.Itoa(i) + "}" + name
			}
			node := p.Node(name)
			perNode[node]++
			shard, err := ring.GetShardClientForKey("hk:" + name)
			if err != nil {
				t.Fatal(err)
			}
			if got := shard.Options().Addr; got != addrs[names[node]] {
				t.Fatalf("Node(%q) = %d (%s), ring picks %s", name, node, names[node], got)
			}
			mustTake(t, s, name, Limit{Rate: 10, Period: longPeriod}, 1)
			if n, err := direct[node].Exists(ctx, "hk:"+name).Result(); err != nil || n != 1 {
				t.Fatalf("key %q not on %s: %d, %v", name, names[node], n, err)
			}
		}
		if perNode[0] < 50 || perNode[1] < 50 {
			t.Errorf("keys per node: %v", perNode)
		}
	}

	t.Run("default hash", func(t *testing.T) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: addrs})
		t.Cleanup(func() { ring.Close() })
		s := newTestStore(t, ring, RedisConfig{})
		if s.Placement().(*ringPlacement).custom != nil {
			t.Error("the built-in rendezvous hash does not match go-redis's")
		}
		check(t, ring, s)
	})

	t.Run("custom hash", func(t *testing.T) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: addrs, NewConsistentHash: newCRCHash})
		t.Cleanup(func() { ring.Close() })
		s := newTestStore(t, ring, RedisConfig{})
		if s.Placement().(*ringPlacement).custom == nil {
			t.Error("custom hash not detected")
		}
		check(t, ring, s)
	})

	t.Run("shard down", func(t *testing.T) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: addrs, HeartbeatFrequency: 20 * time.Millisecond})
		t.Cleanup(func() { ring.Close() })
		s := newTestStore(t, ring, RedisConfig{RefreshInterval: 10 * time.Millisecond})
		v := s.Placement().Version()
		if err := other.Kill(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for s.Placement().Version() == v {
			if time.Now().After(deadline) {
				t.Fatal("placement did not change after a shard went down")
			}
			time.Sleep(10 * time.Millisecond)
		}
		p := s.Placement()
		for i := range 100 {
			if node := p.Node(strconv.Itoa(i)); names[node] != "shard-a" {
				t.Fatalf("Node(%d) = %s, want the live shard-a", i, names[node])
			}
		}
		if err := other.Restart(); err != nil {
			t.Fatal(err)
		}
		deadline = time.Now().Add(time.Minute)
		for s.Placement().Nodes() != 2 || len(s.Placement().(*ringPlacement).live) != 2 {
			if time.Now().After(deadline) {
				t.Fatal("placement did not change after the shard came back")
			}
			time.Sleep(10 * time.Millisecond)
		}
		check(t, ring, s)
	})
}

// crcHash is a consistent hash go-redis does not ship: shards by CRC-32.
type crcHash []string

func newCRCHash(shards []string) redis.ConsistentHash {
	return crcHash(slices.Sorted(slices.Values(shards)))
}

func (h crcHash) Get(key string) string {
	if len(h) == 0 {
		return ""
	}
	return h[crc32.ChecksumIEEE([]byte(key))%uint32(len(h))]
}

func BenchmarkPlacementNode(b *testing.B) {
	slots := &slotPlacement{prefix: "hk:", masters: []string{"a", "b", "c"}, slots: new([numSlots]uint16)}
	ring := &ringPlacement{prefix: "hk:", names: []string{"a", "b", "c"}, live: []int{0, 1, 2}, hashes: []uint64{1, 2, 3}}
	for _, p := range []Placement{slots, ring} {
		b.Run(fmt.Sprintf("%T", p), func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				_ = p.Node(benchKeys[i%len(benchKeys)])
			}
		})
	}
}
