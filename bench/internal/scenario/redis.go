package scenario

import (
	"context"

	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// ScriptCalls returns the scripts the server c talks to has run since its
// stats were last reset (CONFIG RESETSTAT): the store calls of hotkey's
// Redis store, whose every decision is a script (see redistest.ScriptCalls).
func ScriptCalls(ctx context.Context, c *redis.Client) (float64, error) {
	n, err := redistest.ScriptCalls(ctx, c)
	return float64(n), err
}
