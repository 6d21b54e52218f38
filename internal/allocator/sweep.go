package allocator

import (
	"context"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of a sweep.
const (
	// sweepTimeout bounds one sweep of a SKU's shards.
	sweepTimeout = 3 * time.Second
	// sweepKeysMax bounds the keys one sweep looks up; a request whose key
	// did not fit is answered SHARD_UNAVAILABLE (retry) rather than
	// refused unchecked.
	sweepKeysMax = 4096
)

// sweepResult is what one sweep saw of a SKU.
type sweepResult struct {
	available int64 // sum over the shards that answered
	maxShard  int64 // the most any one shard holds
	inTransit int64
	unknown   int // shards with stock that cannot be reached (or are halted) now
	// ops are the SKU's operations recorded for the keys of the requests
	// that joined the sweep (read in its round trip): a sold-out answer
	// replays them on the shard that recorded them. nil: the caller's key
	// was not looked up.
	ops map[string]*stock.Operation
	err *stock.Error
}

// sweeper runs sweeps single-flight per SKU. A request joins only a sweep
// that starts after it arrived: the one queued behind the sweep in flight,
// or a new one. So every answer it gets was read during the request, which
// is what "no false sold-out" needs; and a sell-out storm costs one sweep
// in flight and one queued per SKU, whatever the request rate. Each sweep
// also looks up the keys of the requests that joined it, so a sold-out
// answer costs no second query.
type sweeper struct {
	a       *Allocator
	keysMax int // sweepKeysMax; smaller in tests
	mu      sync.Mutex
	bySKU   map[string]*sweepState
}

type sweepState struct {
	running, next *sweepRun
}

type sweepRun struct {
	keys []string // of the requests that joined; guarded by sweeper.mu until it starts
	done chan struct{}
	res  sweepResult
}

// sweep returns a sweep of sku that started after the call, with the
// operation recorded for key, if any, in its ops.
func (s *sweeper) sweep(ctx context.Context, sku *stock.SKU, key string) sweepResult {
	s.mu.Lock()
	if s.bySKU == nil {
		s.bySKU = map[string]*sweepState{}
	}
	st := s.bySKU[sku.Name]
	if st == nil {
		st = &sweepState{}
		s.bySKU[sku.Name] = st
	}
	var run *sweepRun
	switch {
	case st.running == nil:
		run = &sweepRun{done: make(chan struct{})}
		st.running = run
		go s.loop(sku, st)
	case st.next == nil:
		st.next = &sweepRun{done: make(chan struct{})}
		run = st.next
	default:
		run = st.next
	}
	included := key != "" && len(run.keys) < s.keysMax
	if included {
		run.keys = append(run.keys, key)
	}
	s.mu.Unlock()
	select {
	case <-run.done:
		res := run.res
		if !included {
			res.ops = nil // not looked up
		}
		return res
	case <-ctx.Done():
		return sweepResult{err: stock.Errorf(stock.CodeShardUnavailable, "deadline passed during the stock sweep; retry with the same key")}
	}
}

// loop runs the sweep in flight, then the one queued behind it, until none
// is queued.
func (s *sweeper) loop(sku *stock.SKU, st *sweepState) {
	for {
		s.mu.Lock()
		run := st.running
		keys := run.keys
		s.mu.Unlock()
		start := time.Now()
		run.res = s.a.sweepOnce(sku, keys)
		s.a.metrics.sweeps.Inc()
		s.a.metrics.sweepTime.Observe(time.Since(start).Seconds())
		close(run.done)
		s.mu.Lock()
		st.running, st.next = st.next, nil
		if st.running == nil {
			delete(s.bySKU, sku.Name)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// sweepOnce reads every shard of the SKU and its stock in transit, as
// committed, in one database snapshot. Asking the shard servers (they hold
// the counts in memory) would be no cheaper, and their answers are not of
// one instant: a transfer debited after its source answered and credited
// after its destination answered would be counted nowhere, and a request
// refused OUT_OF_STOCK while the stock exists.
func (a *Allocator) sweepOnce(sku *stock.SKU, keys []string) sweepResult {
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	defer cancel()
	rows, inTransit, ops, err := a.db.Sweep(ctx, sku.Name, keys)
	if err != nil {
		a.log.Debug("sweep failed", "sku", sku.Name, "err", err)
		return sweepResult{err: stock.Errorf(stock.CodeShardUnavailable, "could not read the stock of %s; retry with the same key", sku.Name)}
	}
	res := sweepResult{inTransit: inTransit, ops: ops}
	skip := a.skipper(sku.Name)
	var serving int32
	for _, r := range rows {
		halted := r.HaltReason != ""
		a.setHint(stock.ShardKey{SKU: sku.Name, Index: r.Index}, hint{available: r.Available, known: true, halted: halted})
		if !r.Retiring {
			serving++
		}
		if r.Available > 0 && (halted || skip(r.Index)) {
			// Halted, or its server is down or failing: the stock is there
			// but cannot be sold (nor moved) right now, which is not a
			// sold-out.
			res.unknown++
			continue
		}
		res.available += r.Available
		if !r.Retiring {
			res.maxShard = max(res.maxShard, r.Available) // only a shard in service sells
		}
	}
	if serving != sku.Shards || int32(len(rows)) != max(sku.ShardSpan, sku.Shards) {
		a.forgetSKU(sku.Name) // SetShards changed the layout: read it again
	}
	return res
}
