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

// PeekOp is one counter of a PeekBatch: its arguments, and once the batch
// is done, its Result or Err.
type PeekOp struct {
	Key   string
	Hash  uint64
	Limit Limit

	Result Result
	Err    error
}

// BatchPeeker is implemented by Peekers that can read many counters in
// fewer calls than one each.
type BatchPeeker interface {
	Peeker
	// PeekBatch peeks at each of ops as Peek would, and sets its Result or
	// Err. It returns when all are done. PeekBatch may block on I/O.
	PeekBatch(ctx context.Context, ops []PeekOp)
}

var (
	_ BatchPeeker = (*MemoryStore)(nil)
	_ BatchPeeker = (*RedisStore)(nil)
)

// Peek implements Peeker: a Take of one unit on a copy of the counter's
// state at the store's clock, the copy discarded. It never fails.
func (s *MemoryStore) Peek(_ context.Context, key string, hash uint64, lim Limit) (Result, error) {
	t := s.nanos(s.clock())
	c := s.peek(Shard{Name: key, Hash: hash, Limit: lim}, t, lim.Algorithm == SlidingLog)
	return c.take(t, lim, 1), nil
}

// PeekBatch implements BatchPeeker: a Peek of each op in turn.
func (s *MemoryStore) PeekBatch(ctx context.Context, ops []PeekOp) {
	for i := range ops {
		op := &ops[i]
		op.Result, op.Err = s.Peek(ctx, op.Key, op.Hash, op.Limit)
	}
}

// peekSources are the Take scripts without their writes: each answers a
// take of one unit as its script would, and leaves the key as it was (the
// sliding log still drops the entries that have left its window, which no
// take counts, and a key of another algorithm, which no take reads).
var peekSources = [numAlgorithms]string{
	TokenBucket:   peekSource(gcraScript, "\tif moved then\n", "\tif false then\n"),
	SlidingWindow: peekSource(slidingWindowScript, "\t\tredis.call('SET', k, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', int(ceil((left + p) / 1000)))\n", ""),
	FixedWindow:   peekSource(fixedWindowScript, "\t\tredis.call('SET', k, string.format('%.0f %.0f', w, cur), 'PX', int(math.ceil(reset / 1000)))\n", ""),
	SlidingLog: peekSource(slidingLogScript, "\t\t\tredis.call('ZADD', k, unpack(args))\n", "",
		"\t\tredis.call('PEXPIRE', k, int(math.ceil(p / 1000)))\n", ""),
}

// peekScripts are peekSources, loaded with the Take scripts.
var peekScripts = func() (out [numAlgorithms]*redis.Script) {
	for i, src := range peekSources {
		out[i] = redis.NewScript(src)
	}
	return out
}()

// peekSource returns src with each pair of old, new replaced once. It
// panics if an old is not in src: the Take script changed, and its peek
// must change with it.
func peekSource(src string, oldNew ...string) string {
	for i := 0; i < len(oldNew); i += 2 {
		if strings.Count(src, oldNew[i]) != 1 {
			panic(fmt.Sprintf("counter: peek script: %q is not once in its Take script", oldNew[i]))
		}
		src = strings.Replace(src, oldNew[i], oldNew[i+1], 1)
	}
	return src
}

// Peek implements Peeker: the algorithm's Take script without its writes,
// in a round trip of its own (peeks are rare: they are not queued for the
// workers' batches).
func (s *RedisStore) Peek(ctx context.Context, key string, _ uint64, lim Limit) (Result, error) {
	if lim.Algorithm >= numAlgorithms {
		return Result{}, fmt.Errorf("redis peek: %w: %d", ErrUnknownAlgorithm, lim.Algorithm)
	}
	if !s.ready.Load() {
		return Result{}, fmt.Errorf("redis peek: %w", s.notReady())
	}
	var c call
	c.setArgs(lim, 1)
	return c.decodePeek(peekScripts[lim.Algorithm].Run(ctx, s.client, []string{s.cfg.Prefix + key}, c.appendArgs(nil)...))
}

// PeekBatch implements BatchPeeker: one script call per op, all in one
// pipeline, which a Cluster or Ring client splits into one round trip per
// node, sent at once. If the server lost the peek scripts (NOSCRIPT), they
// are loaded again and the ops that failed so sent again, once.
func (s *RedisStore) PeekBatch(ctx context.Context, ops []PeekOp) {
	calls := make([]call, len(ops))
	send := make([]int, 0, len(ops)) // indexes of the ops to send
	for i := range ops {
		op := &ops[i]
		op.Result, op.Err = Result{}, nil
		switch {
		case op.Limit.Algorithm >= numAlgorithms:
			op.Err = fmt.Errorf("redis peek: %w: %d", ErrUnknownAlgorithm, op.Limit.Algorithm)
		case !s.ready.Load():
			op.Err = fmt.Errorf("redis peek: %w", s.notReady())
		default:
			calls[i].setArgs(op.Limit, 1)
			send = append(send, i)
		}
	}
	if len(send) == 0 {
		return
	}
	lost := s.peekPipeline(ctx, ops, calls, send, true)
	if len(lost) == 0 {
		return
	}
	if err := s.loadScripts(ctx); err != nil {
		for _, i := range lost {
			ops[i].Err = fmt.Errorf("redis peek: %w", err)
		}
		return
	}
	s.peekPipeline(ctx, ops, calls, lost, false)
}

// peekPipeline sends the peeks of ops[i] for each i in send in one
// pipeline, and sets their results. With keepLost, it leaves the ops that
// failed with NOSCRIPT unset and returns their indexes (in send's array).
func (s *RedisStore) peekPipeline(ctx context.Context, ops []PeekOp, calls []call, send []int, keepLost bool) []int {
	cmds := make([]*redis.Cmd, len(send))
	pipe := s.client.Pipeline()
	for j, i := range send {
		c := &calls[i]
		cmds[j] = pipe.EvalSha(ctx, peekScripts[c.alg].Hash(), []string{s.cfg.Prefix + ops[i].Key}, c.appendArgs(nil)...)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	lost := send[:0]
	for j, i := range send {
		if keepLost && redis.HasErrorPrefix(cmds[j].Err(), "NOSCRIPT") {
			lost = append(lost, i)
			continue
		}
		ops[i].Result, ops[i].Err = calls[i].decodePeek(cmds[j])
	}
	return lost
}

// decodePeek returns the Result of c's peek script in cmd, or its error.
func (c *call) decodePeek(cmd *redis.Cmd) (Result, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return Result{}, fmt.Errorf("redis peek: %w", err)
	}
	if len(v) != replyWidth[c.alg] {
		return Result{}, fmt.Errorf("redis peek: %d integers in the reply, want %d", len(v), replyWidth[c.alg])
	}
	return c.decode(v), nil
}
