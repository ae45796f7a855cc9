package counter

import (
	"context"
	"fmt"
)

var _ Batcher = (*RedisStore)(nil)

// TakeBatch implements Batcher: it sends ops in one round trip (one per
// MaxBatch of them) on the caller's goroutine, grouped as the workers group
// the calls they gather, so that a batch costs what a worker's batch costs.
func (s *RedisStore) TakeBatch(ctx context.Context, ops []Op) {
	w := s.batchWorkers.Get().(*worker)
	defer s.batchWorkers.Put(w)
	for start := 0; start < len(ops); start += s.cfg.MaxBatch {
		s.runOps(ctx, w, ops[start:min(len(ops), start+s.cfg.MaxBatch)])
	}
}

// runOps runs ops (at most MaxBatch) as one batch of w.
func (s *RedisStore) runOps(ctx context.Context, w *worker, ops []Op) {
	w.held = w.held[:0]
	for i := range ops {
		op := &ops[i]
		op.Result, op.Err = Result{}, nil
		switch {
		case op.Limit.Algorithm >= numAlgorithms:
			op.Err = fmt.Errorf("redis take: %w: %d", ErrUnknownAlgorithm, op.Limit.Algorithm)
			continue
		case s.ctx.Err() != nil:
			op.Err = fmt.Errorf("redis take: %w", ErrStoreClosed)
			continue
		case !s.ready.Load():
			op.Err = fmt.Errorf("redis take: %w", s.notReady())
			continue
		}
		c := callPool.Get().(*call)
		c.ctx, c.key = ctx, s.cfg.Prefix+op.Key
		c.setArgs(op.Limit, op.N)
		w.held = append(w.held, c)
	}
	if len(w.held) == 0 {
		return
	}
	// run reorders w.batch; w.held keeps the calls in the order of ops.
	w.batch = append(w.batch[:0], w.held...)
	w.run() // finishes every call before it returns
	j := 0
	for i := range ops {
		op := &ops[i]
		if op.Err != nil {
			continue
		}
		c := w.held[j]
		j++
		<-c.done
		op.Result, op.Err = c.res, c.err
		c.release()
		w.held[j-1] = nil
	}
}
