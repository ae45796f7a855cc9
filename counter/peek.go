package counter

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Peeker is implemented by stores that can tell what a Take would answer
// without taking.
type Peeker interface {
	// Peek returns what Take(ctx, key, hash, lim, 1) would answer now,
	// without charging the unit or changing the counter's usage. It
	// validates nothing, as Take. Peek may block on I/O.
	Peek(ctx context.Context, key string, hash uint64, lim Limit) (Result, error)
}

var (
	_ Peeker = (*MemoryStore)(nil)
	_ Peeker = (*RedisStore)(nil)
)

// Peek implements Peeker: a Take of one unit on a copy of the counter's
// state at the store's clock, the copy discarded. It never fails.
func (s *MemoryStore) Peek(_ context.Context, key string, hash uint64, lim Limit) (Result, error) {
	t := s.nanos(s.clock())
	c := s.peek(Shard{Name: key, Hash: hash, Limit: lim}, t, lim.Algorithm == SlidingLog)
	return c.take(t, lim, 1), nil
}

// peekScripts are the Take scripts without their writes: each answers a
// take of one unit as its script would, and leaves the key as it was (the
// sliding log still drops the entries that have left its window, which no
// take counts, and a key of another algorithm, which no take reads).
var peekScripts = [numAlgorithms]*redis.Script{
	TokenBucket:   peekScript(gcraScript, "\tif moved then\n", "\tif false then\n"),
	SlidingWindow: peekScript(slidingWindowScript, "\t\tredis.call('SET', k, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', int(ceil((left + p) / 1000)))\n", ""),
	FixedWindow:   peekScript(fixedWindowScript, "\t\tredis.call('SET', k, string.format('%.0f %.0f', w, cur), 'PX', int(math.ceil(reset / 1000)))\n", ""),
	SlidingLog: peekScript(slidingLogScript, "\t\t\tredis.call('ZADD', k, unpack(args))\n", "",
		"\t\tredis.call('PEXPIRE', k, int(math.ceil(p / 1000)))\n", ""),
}

// peekScript returns src with each pair of old, new replaced once. It
// panics if an old is not in src: the Take script changed, and its peek
// must change with it.
func peekScript(src string, oldNew ...string) *redis.Script {
	for i := 0; i < len(oldNew); i += 2 {
		if strings.Count(src, oldNew[i]) != 1 {
			panic(fmt.Sprintf("counter: peek script: %q is not once in its Take script", oldNew[i]))
		}
		src = strings.Replace(src, oldNew[i], oldNew[i+1], 1)
	}
	return redis.NewScript(src)
}

// Peek implements Peeker: the algorithm's Take script without its writes,
// in a round trip of its own (peeks are rare: they are not batched).
func (s *RedisStore) Peek(ctx context.Context, key string, _ uint64, lim Limit) (Result, error) {
	if lim.Algorithm >= numAlgorithms {
		return Result{}, fmt.Errorf("redis peek: %w: %d", ErrUnknownAlgorithm, lim.Algorithm)
	}
	if !s.ready.Load() {
		return Result{}, fmt.Errorf("redis peek: %w", s.notReady())
	}
	var c call
	c.setArgs(lim, 1)
	args := c.appendArgs(nil)
	v, err := peekScripts[lim.Algorithm].Run(ctx, s.client, []string{s.cfg.Prefix + key}, args...).Int64Slice()
	if err != nil {
		return Result{}, fmt.Errorf("redis peek: %w", err)
	}
	if len(v) != replyWidth[lim.Algorithm] {
		return Result{}, fmt.Errorf("redis peek: %d integers in the reply, want %d", len(v), replyWidth[lim.Algorithm])
	}
	return c.decode(v), nil
}
