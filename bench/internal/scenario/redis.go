package scenario

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ScriptCalls returns the EVAL and EVALSHA calls the server c talks to has
// answered since its stats were last reset (CONFIG RESETSTAT): the store
// calls of hotkey's Redis store, whose every decision is a script.
func ScriptCalls(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	n := 0.0
	for line := range strings.Lines(info) {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for field := range strings.SplitSeq(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				n += f
			}
		}
	}
	return n, nil
}
