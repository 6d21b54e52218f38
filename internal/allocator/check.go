package allocator

import (
	"context"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of a sold-out check.
const (
	// checkTimeout bounds one check of a SKU's shards.
	checkTimeout = 3 * time.Second
	// checkKeysMax bounds the keys one check looks up; a request whose key
	// did not fit is answered SHARD_UNAVAILABLE (retry) rather than
	// refused unchecked.
	checkKeysMax = 4096
)

// checkResult is what one check saw of a SKU.
type checkResult struct {
	available int64 // sum over the shards that answered
	maxShard  int64 // the most any one shard holds
	inTransit int64
	unknown   int // shards with stock that cannot be reached (or are halted) now
	// forGood: no unit available, held or in transit (soldOutForGood): the
	// SKU can be marked sold out.
	forGood bool
	// ops are the SKU's operations recorded for the keys of the requests
	// that joined the check (read in its round trip): a sold-out answer
	// replays them on the shard that recorded them. nil: the caller's key
	// was not looked up.
	ops map[string]*stock.Operation
	err *stock.Error
}

// checker runs checks single-flight per SKU. A request joins only a check
// that starts after it arrived: the one queued behind the check in flight,
// or a new one. So every answer it gets was read during the request, which
// is what "no false sold-out" needs; and a sell-out storm costs one check
// in flight and one queued per SKU, whatever the request rate. Each check
// also looks up the keys of the requests that joined it, so a sold-out
// answer costs no second query.
type checker struct {
	a       *Allocator
	keysMax int // checkKeysMax; smaller in tests
	mu      sync.Mutex
	bySKU   map[string]*checkState
}

type checkState struct {
	running, next *checkRun
}

type checkRun struct {
	keys []string // of the requests that joined; guarded by checker.mu until it starts
	done chan struct{}
	res  checkResult
}

// check returns a check of sku that started after the call, with the
// operation recorded for key, if any, in its ops.
func (s *checker) check(ctx context.Context, sku *stock.SKU, key string) checkResult {
	s.mu.Lock()
	if s.bySKU == nil {
		s.bySKU = map[string]*checkState{}
	}
	st := s.bySKU[sku.Name]
	if st == nil {
		st = &checkState{}
		s.bySKU[sku.Name] = st
	}
	var run *checkRun
	switch {
	case st.running == nil:
		run = &checkRun{done: make(chan struct{})}
		st.running = run
		go s.loop(sku, st)
	case st.next == nil:
		st.next = &checkRun{done: make(chan struct{})}
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
		return checkResult{err: stock.Errorf(stock.CodeShardUnavailable, "deadline passed during the stock check; retry with the same key")}
	}
}

// loop runs the check in flight, then the one queued behind it, until none
// is queued.
func (s *checker) loop(sku *stock.SKU, st *checkState) {
	for {
		s.mu.Lock()
		run := st.running
		keys := run.keys
		s.mu.Unlock()
		start := time.Now()
		run.res = s.a.checkOnce(sku, keys)
		s.a.metrics.checks.Inc()
		s.a.metrics.checkTime.Observe(time.Since(start).Seconds())
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

// checkOnce reads every shard of the SKU and its stock in transit, as
// committed, in one database snapshot. Asking the shard servers (they hold
// the counts in memory) would be no cheaper, and their answers are not of
// one instant: a transfer debited after its source answered and credited
// after its destination answered would be counted nowhere, and a request
// refused OUT_OF_STOCK while the stock exists.
func (a *Allocator) checkOnce(sku *stock.SKU, keys []string) checkResult {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	rows, inTransit, ops, err := a.db.SoldOutCheck(ctx, sku.Name, keys)
	if err != nil {
		a.log.Debug("check failed", "sku", sku.Name, "err", err)
		return checkResult{err: stock.Errorf(stock.CodeShardUnavailable, "could not read the stock of %s; retry with the same key", sku.Name)}
	}
	res := checkResult{inTransit: inTransit, ops: ops, forGood: soldOutForGood(rows, inTransit)}
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
