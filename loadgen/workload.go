package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// A Workload says which key each request of a run is for. A run asks it for
// request after request from one goroutine, in order, with the instant each
// is meant to be sent (t after the run's start, never decreasing): a
// Workload need not be safe for concurrent use, and a run must have one of
// its own.
type Workload interface {
	Key(i int64, t time.Duration) string
}

// Uniform spreads requests evenly at random over n keys, prefix0 to
// prefix(n-1).
func Uniform(prefix string, n int, seed uint64) Workload {
	return &uniform{keys: keyNames(prefix, n), r: rand.New(rand.NewPCG(seed, 1))}
}

type uniform struct {
	keys []string
	r    *rand.Rand
}

func (u *uniform) Key(int64, time.Duration) string { return u.keys[u.r.IntN(len(u.keys))] }

// Zipf draws requests from n keys by Zipf's law with exponent s > 1: key k
// (prefix0 the most popular) is asked in proportion to 1/(k+1)^s. s near 1
// is the long tail of real API traffic; larger s concentrates it.
func Zipf(prefix string, n int, s float64, seed uint64) (Workload, error) {
	if !(s > 1) || n < 1 {
		return nil, fmt.Errorf("zipf: s %v must be > 1 and n %d ≥ 1", s, n)
	}
	r := rand.New(rand.NewPCG(seed, 2))
	return &zipf{keys: keyNames(prefix, n), z: rand.NewZipf(r, s, 1, uint64(n-1))}, nil
}

type zipf struct {
	keys []string
	z    *rand.Zipf
}

func (z *zipf) Key(int64, time.Duration) string { return z.keys[z.z.Uint64()] }

// Fixed sends every request to key.
func Fixed(key string) Workload { return fixed(key) }

type fixed string

func (f fixed) Key(int64, time.Duration) string { return string(f) }

// Flood asks for a new random key every request (prefix + 16 hex digits):
// an attacker filling the detector's and the store's tables.
func Flood(prefix string, seed uint64) Workload {
	return &flood{prefix: prefix, r: rand.New(rand.NewPCG(seed, 3))}
}

type flood struct {
	prefix string
	r      *rand.Rand
	buf    []byte
}

func (f *flood) Key(int64, time.Duration) string {
	f.buf = strconv.AppendUint(append(f.buf[:0], f.prefix...), f.r.Uint64(), 16)
	return string(f.buf)
}

// Hotspot sends key at rate requests per second, and the rest of the run's
// requests to background: one hot client over ordinary traffic. The run's
// rate must be above rate.
func Hotspot(key string, rate float64, background Workload) Workload {
	return &shaped{key: key, bg: background, due: func(t time.Duration) float64 { return rate * t.Seconds() }}
}

// Ramp sends key at a rate that rises linearly from 0 to peak requests per
// second over rise, holds peak for hold, and falls back to 0 over fall; the
// rest of the run's requests, and all after the fall, go to background. It
// drives a key through splitting and merging. The run's rate must be above
// peak.
func Ramp(key string, peak float64, rise, hold, fall time.Duration, background Workload) Workload {
	return &shaped{key: key, bg: background, due: func(t time.Duration) float64 {
		return peak * rampArea(t.Seconds(), rise.Seconds(), hold.Seconds(), fall.Seconds())
	}}
}

// RampRate returns the rate of a Ramp's key at t: what Ramp(key, peak, rise,
// hold, fall, _) sends it at.
func RampRate(peak float64, rise, hold, fall, t time.Duration) float64 {
	switch {
	case t < 0 || t >= rise+hold+fall:
		return 0
	case t < rise:
		return peak * t.Seconds() / rise.Seconds()
	case t < rise+hold:
		return peak
	}
	return peak * (rise + hold + fall - t).Seconds() / fall.Seconds()
}

// rampArea is the integral from 0 to t of a ramp of height 1 rising over r,
// holding for h and falling over f (all in seconds).
func rampArea(t, r, h, f float64) float64 {
	switch {
	case t <= 0:
		return 0
	case t < r:
		return t * t / r / 2
	case t < r+h:
		return r/2 + (t - r)
	case t < r+h+f:
		d := r + h + f - t // time left in the fall
		return r/2 + h + f/2 - d*d/f/2
	}
	return r/2 + h + f/2
}

// shaped sends key whenever the requests it is due by t (due(t), rising)
// pass a whole number, and the others to bg.
type shaped struct {
	key  string
	bg   Workload
	due  func(t time.Duration) float64
	sent int64
}

func (s *shaped) Key(i int64, t time.Duration) string {
	if int64(math.Floor(s.due(t))) > s.sent {
		s.sent++
		return s.key
	}
	return s.bg.Key(i, t)
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, max(n, 1))
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}
