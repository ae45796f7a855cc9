package hotkey

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

// Shares (RegionsShares): a fixed window's limit split into one share a
// region, the shares adding up to the limit exactly, each enforced by the
// region on its own store. In each window a region starts with its base
// share: the limit divided by the regions, the remainder one unit each to
// the first regions in name order. Shares move toward demand within the
// window:
//
//   - A region that denies a key for want of share asks the others for
//     units (a need), at most once an interval per key and daemon.
//   - A daemon of another region that has room to spare (its share, less
//     what its region used, less what it expects to use before the
//     window ends at its pace so far, divided among its region's live
//     daemons) takes those units from its own counter, as a decision of
//     that many would, and only then sends them to the needy region (a
//     grant). Taken, they leave its share for good in that window.
//   - Each daemon of the needy region adds a grant to its view of its
//     share, once (by the grant's id), in the grant's window only.
//
// So the units a region may admit are its base share, plus what it was
// granted, less what it gave away (taken from its counter before they were
// sent): all regions together never more than the limit, while a grant is
// in flight, lost, applied twice or late. A partition keeps each side to
// the shares it holds. A grant counts until shareGuard before its
// window's end, and is given only that far from both edges (see window),
// so that a daemon whose clock is a little off its store's never counts
// a grant, or takes what it grants, in another window.
// The price: a region whose demand outgrows its share denies until a grant
// arrives (an interval and a delivery), and units granted but not used
// are lost to the window.

// shareMsg is a need or a grant between regions.
type shareMsg struct {
	Kind   string `json:"k"`           // "need" or "grant"
	Policy string `json:"p"`           // the policy's name
	Key    string `json:"key"`         // the key
	Window int64  `json:"w"`           // the window's index: Unix ns ÷ the period
	Units  int64  `json:"u"`           // wanted, or granted
	ID     string `json:"id,omitzero"` // a grant's: its sender and number
}

// shareMagic starts a shares payload: a round of totals starts with the
// gossip codec's version byte, 1.
const shareMagic = 'S'

// shareKey is a (policy, key) a region holds a share view of.
type shareKey struct{ policy, key string }

// shareView is a daemon's view of its region's share of a key in one
// window: what it was granted, by grant id, and when it last asked.
type shareView struct {
	window  int64
	granted int64 // units other regions granted this one
	gave    int64 // units this daemon granted other regions
	ids     map[string]struct{}
	asked   int64 // when a need was last sent, on monotonic(); 0: never
}

// maxShareViews bounds the keys a daemon keeps share views of; past it a
// new key's grants are not taken (its share stays the base).
const maxShareViews = 1 << 16

// shareGuard is how far from a window's edges grants are counted and
// given (see window): a twentieth of the period, at most a second.
func shareGuard(period time.Duration) int64 {
	return int64(min(period/20, time.Second))
}

// regionIndex returns the regions of the fleet, sorted, and this one's
// index among them.
func (x *exchange) regionIndex() (int, int) {
	all := append([]string{x.e.opt.region}, x.to...)
	sort.Strings(all)
	return sort.SearchStrings(all, x.e.opt.region), len(all)
}

// baseShare is this region's base share of lim.
func (x *exchange) baseShare(lim Limit) int64 {
	i, n := x.regionIndex()
	b := lim.Rate / int64(n)
	if int64(i) < lim.Rate%int64(n) {
		b++
	}
	return b
}

// window returns the index of the window of period that holds t (Unix
// ns), and whether t is short of its end by shareGuard (early) and past
// its start by it too (inside). A daemon's clock may be off its store's
// by a little: a grant counts toward a decision only while early, so that
// a store already in the next window never counts it there; a daemon
// gives only while inside, so that the units it takes leave the window it
// grants them in, whichever side of the edge the store is.
func window(t int64, period time.Duration) (w int64, early, inside bool) {
	p := int64(period)
	w = t / p
	g := shareGuard(period)
	off := t - w*p
	return w, off < p-g, off >= g && off < p-g
}

// shareLimit returns the limit a decision of key under p, a RegionsShares
// policy, is taken under at now: p's, its rate the region's share.
func (x *exchange) shareLimit(p *Policy, key string, now time.Time) Limit {
	lim := p.Limit
	lim.Rate = x.baseShare(p.Limit)
	w, early, _ := window(now.UnixNano(), lim.Period)
	if !early {
		return lim
	}
	x.shareMu.Lock()
	defer x.shareMu.Unlock()
	if v := x.shares[shareKey{p.Name, key}]; v != nil && v.window == w {
		lim.Rate = min(lim.Rate+v.granted, p.Limit.Rate)
	}
	return lim
}

// denied notes a decision of key under p denied at now for want of share,
// and asks the other regions for units, at most once an interval.
func (x *exchange) denied(p *Policy, key string, n int64, now time.Time) {
	t := now.UnixNano()
	w, _, _ := window(t, p.Limit.Period)
	asked := int64(monotonic()) // how often it asks is the network's matter, not the clock's
	x.shareMu.Lock()
	v := x.view(shareKey{p.Name, key}, w)
	if v == nil || v.asked != 0 && asked-v.asked < int64(x.interval) {
		x.shareMu.Unlock()
		return
	}
	v.asked = asked
	x.shareMu.Unlock()
	want := max(n, int64(math.Ceil(float64(p.Limit.Rate)/float64(len(x.to)+1)/4)))
	x.publishShare(x.to, shareMsg{Kind: "need", Policy: p.Name, Key: key, Window: w, Units: want})
}

// view returns key's share view for window w, made or renewed if need
// be; nil when maxShareViews are held. The caller holds x.shareMu.
func (x *exchange) view(k shareKey, w int64) *shareView {
	v := x.shares[k]
	if v == nil {
		if len(x.shares) >= maxShareViews {
			x.sweepShares(w)
			if len(x.shares) >= maxShareViews {
				return nil
			}
		}
		v = &shareView{window: w}
		x.shares[k] = v
	}
	if v.window != w {
		*v = shareView{window: w}
	}
	return v
}

// sweepShares forgets the views of windows before w. The caller holds
// x.shareMu.
func (x *exchange) sweepShares(w int64) {
	for k, v := range x.shares {
		if v.window < w {
			delete(x.shares, k)
		}
	}
}

// publishShare sends m to the regions to, counting what they did not take.
func (x *exchange) publishShare(to []string, m shareMsg) {
	b, err := json.Marshal(m)
	if err != nil {
		x.errors.Add(1)
		return
	}
	payload := append([]byte{shareMagic}, b...)
	for _, r := range to {
		if err := x.pub.PublishRegion(r, payload); err != nil {
			x.errors.Add(1)
		}
	}
}

// applyShare handles a need or a grant from region from.
func (x *exchange) applyShare(from string, payload []byte) {
	var m shareMsg
	if err := json.Unmarshal(payload[1:], &m); err != nil || m.Units <= 0 || m.Key == "" {
		x.drops[xdropMalformed].Add(1)
		return
	}
	v, known := x.policies.Load(m.Policy)
	if !known || v.(*Policy).Regions != RegionsShares {
		x.drops[xdropPolicy].Add(1)
		return
	}
	p := v.(*Policy)
	if _, _, err := x.e.counterName(m.Key, p, 1); err != nil {
		x.drops[xdropKey].Add(1)
		return
	}
	now := x.e.opt.clock()
	w, early, inside := window(now.UnixNano(), p.Limit.Period)
	if m.Window != w || !early || m.Kind == "need" && !inside {
		x.drops[xdropLate].Add(1) // of another window, or at its edge
		return
	}
	x.last[from].Store(now.UnixNano())
	switch m.Kind {
	case "grant":
		x.shareMu.Lock()
		sv := x.view(shareKey{p.Name, m.Key}, w)
		if sv != nil {
			if _, dup := sv.ids[m.ID]; !dup && m.ID != "" {
				if sv.ids == nil {
					sv.ids = make(map[string]struct{})
				}
				sv.ids[m.ID] = struct{}{}
				sv.granted = min(sv.granted+m.Units, p.Limit.Rate)
				x.granted[from].Add(uint64(m.Units))
			}
		}
		x.shareMu.Unlock()
	case "need":
		x.give(from, p, m, now)
	default:
		x.drops[xdropMalformed].Add(1)
	}
}

// give answers region from's need m under p at now: it takes from its own
// counter the units its region can spare, up to m.Units, and grants them.
func (x *exchange) give(from string, p *Policy, m shareMsg, now time.Time) {
	lim := x.shareLimit(p, m.Key, now)
	name, hash, err := x.e.counterName(m.Key, p, 1)
	if err != nil {
		return
	}
	ctx := x.e.life
	peek, err := x.e.peekShare(ctx, p, name, hash, lim)
	if err != nil {
		return
	}
	used := lim.Rate - peek.Remaining - 1
	if !peek.Allowed {
		used = lim.Rate
	}
	x.shareMu.Lock()
	sv := x.view(shareKey{p.Name, m.Key}, m.Window)
	var gave int64
	if sv != nil {
		gave = sv.gave
	}
	x.shareMu.Unlock()
	period := int64(p.Limit.Period)
	into := now.UnixNano() - m.Window*period
	left := period - into
	// What the region will use before the window ends, at its pace so
	// far: its counter's count but for the units given away (this
	// daemon's; the other daemons' count as use, which gives less).
	expect := int64(math.Ceil(float64(max(0, used-gave)) * float64(left) / float64(max(into, 1))))
	spare := (lim.Rate - used - expect) / int64(max(1, x.e.liveInstances()))
	g := min(m.Units, spare)
	if g <= 0 {
		return
	}
	r, err := x.e.takeShare(ctx, p, name, hash, lim, g)
	if err != nil || !r.Allowed {
		return
	}
	x.shareMu.Lock()
	if sv := x.view(shareKey{p.Name, m.Key}, m.Window); sv != nil {
		sv.gave += g
	}
	x.shareMu.Unlock()
	x.grants++
	id := x.sender + "." + strconv.FormatInt(x.start, 36) + "." + strconv.FormatUint(x.grants, 36)
	x.gave[from].Add(uint64(g))
	x.publishShare([]string{from}, shareMsg{Kind: "grant", Policy: p.Name, Key: m.Key, Window: m.Window, Units: g, ID: id})
}

// checkShares refuses a RegionsShares policy whose algorithm is not a
// fixed window.
func checkShares(p *Policy) error {
	if p.Limit.Algorithm != FixedWindow {
		return fmt.Errorf("policy %q: regions shares splits a fixed window's limit, not a %v's", p.Name, p.Limit.Algorithm)
	}
	return nil
}

// decideShares decides n units of key (counter name) under p, a
// RegionsShares policy, on its one counter under the region's share, and
// asks the other regions for units when it denies.
func (e *Engine) decideShares(ctx context.Context, p *Policy, key, name string, hash uint64, n int64) (Result, error) {
	now := e.opt.clock()
	lim := e.xr.shareLimit(p, key, now)
	r, err := e.takeShare(ctx, p, name, hash, lim, n)
	if err == nil && !r.Allowed {
		e.xr.denied(p, key, n, now)
	}
	return r, err
}

// takeShare takes n units of counter name under lim, p's limit at the
// region's share, on the store of p's Sync.
func (e *Engine) takeShare(ctx context.Context, p *Policy, name string, hash uint64, lim Limit, n int64) (Result, error) {
	switch p.Sync {
	case SyncGossip:
		return e.decideGossip(name, hash, lim, n), nil
	case SyncReserve:
		return e.decideReserve(ctx, name, hash, lim, n)
	}
	return e.decide(ctx, e.store, name, hash, lim, n)
}

// peekShare peeks at counter name under lim, p's limit at the region's
// share, on the store of p's Sync.
func (e *Engine) peekShare(ctx context.Context, p *Policy, name string, hash uint64, lim Limit) (Result, error) {
	if p.Sync == SyncGossip {
		return e.peekGossip(name, hash, lim), nil
	}
	peeker, ok := e.store.(counter.Peeker)
	if !ok {
		return Result{}, errNoPeek
	}
	return e.peekStore(ctx, peeker, name, hash, lim, false)
}

// ShareStats is a RegionsShares policy's shares in this region's current
// window, as one instance sees them (Engine.RegionShares).
type ShareStats struct {
	Base    int64 // the region's base share of a key
	Keys    int   // keys with a grant given or taken in the window
	Granted int64 // units other regions granted this one, all keys
	Gave    int64 // units this instance granted other regions, all keys
}

// RegionShares returns, per RegionsShares policy known, its shares in the
// current window; nil without an exchange between regions.
func (e *Engine) RegionShares() map[string]ShareStats {
	x := e.xr
	if x == nil {
		return nil
	}
	out := map[string]ShareStats{}
	now := e.opt.clock().UnixNano()
	x.policies.Range(func(_, v any) bool {
		if p := v.(*Policy); p.Regions == RegionsShares {
			out[p.Name] = ShareStats{Base: x.baseShare(p.Limit)}
		}
		return true
	})
	x.shareMu.Lock()
	defer x.shareMu.Unlock()
	for k, v := range x.shares {
		st, ok := out[k.policy]
		if !ok {
			continue
		}
		pv, _ := x.policies.Load(k.policy)
		if w, _, _ := window(now, pv.(*Policy).Limit.Period); v.window != w {
			continue
		}
		st.Keys++
		st.Granted += v.granted
		st.Gave += v.gave
		out[k.policy] = st
	}
	return out
}
