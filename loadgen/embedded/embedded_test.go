package embedded

import (
	"errors"
	"testing"

	"github.com/hotkeyd/hotkey/counter"
)

// TestStartFails: a store that cannot be made fails Start with its error,
// and what Start had made is closed.
func TestStartFails(t *testing.T) {
	boom := errors.New("no store")
	c, err := Start(Config{Instances: 2, Store: func(i int) (counter.Store, error) {
		if i == 1 {
			return nil, boom
		}
		return counter.NewMemoryStore(counter.MemoryConfig{}), nil
	}})
	if c != nil || !errors.Is(err, boom) {
		t.Fatalf("Start = %v, %v; want nil and the store's error", c, err)
	}
	if _, err := (*Cluster)(nil).Target(nil); err == nil {
		t.Error("a nil cluster's target: no error")
	}
}
