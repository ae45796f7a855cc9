package hotkey

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestInputErrorsAgree: Allow, Peek and Reset refuse the same bad input
// with the same error, in one precedence (see Engine.counterName), also
// when more than one thing is wrong with it; Allow checks the cost and the
// policy's Sync besides.
func TestInputErrorsAgree(t *testing.T) {
	clock := testkit.NewClock()
	e := newEngineOn(t, counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), clock)
	ctx := context.Background()
	long := strings.Repeat("x", DefaultMaxKeyLen+1)
	ok, bad := PerSecond(10), PerSecond(0)
	const noSync = Sync(99) // no engine keeps it
	for _, tt := range []struct {
		name string
		key  string
		p    *Policy
		n    int64 // Allow's cost; Peek and Reset are asked of 1
		want error
	}{
		{"empty key", "", &Policy{Name: "p", Limit: ok}, 1, ErrEmptyKey},
		{"key too long", long, &Policy{Name: "p", Limit: ok}, 1, ErrKeyTooLong},
		{"name holds |", "k", &Policy{Name: "a|b", Limit: ok}, 1, ErrInvalidPolicyName},
		{"invalid limit", "k", &Policy{Name: "p", Limit: bad}, 1, ErrInvalidLimit},
		{"empty key, name holds |", "", &Policy{Name: "a|b", Limit: ok}, 1, ErrEmptyKey},
		{"key too long, invalid limit", long, &Policy{Name: "p", Limit: bad}, 1, ErrKeyTooLong},
		{"name holds |, invalid limit", "k", &Policy{Name: "a|b", Limit: bad}, 1, ErrInvalidLimit},
		{"empty key, no sync", "", &Policy{Name: "p", Limit: ok, Sync: noSync}, 1, ErrEmptyKey},
		{"invalid limit, no sync", "k", &Policy{Name: "p", Limit: bad, Sync: noSync}, 1, ErrInvalidLimit},
		{"name holds |, no sync", "k", &Policy{Name: "a|b", Limit: ok, Sync: noSync}, 1, ErrInvalidPolicyName},
		{"cost 0", "k", &Policy{Name: "p", Limit: ok}, 0, ErrInvalidCost},
		{"cost -1, name holds |", "k", &Policy{Name: "a|b", Limit: ok}, -1, ErrInvalidCost},
		{"cost over burst", "k", &Policy{Name: "p", Limit: ok}, 11, ErrCostExceedsBurst},
		{"no sync", "k", &Policy{Name: "p", Limit: ok, Sync: noSync}, 1, errors.ErrUnsupported},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			if _, err := e.AllowN(ctx, tt.key, p, tt.n); !errors.Is(err, tt.want) {
				t.Errorf("AllowN(%d): %v, want %v", tt.n, err, tt.want)
			}
			if tt.n != 1 || p.Sync == noSync && tt.want == errors.ErrUnsupported {
				return // Peek and Reset take no cost and read any Sync
			}
			if _, err := e.Peek(ctx, tt.key, p); !errors.Is(err, tt.want) {
				t.Errorf("Peek: %v, want %v", err, tt.want)
			}
			if err := e.Reset(ctx, tt.key, p); !errors.Is(err, tt.want) {
				t.Errorf("Reset: %v, want %v", err, tt.want)
			}
		})
	}
}
