package allocator

import (
	"context"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/rpc"
	"github.com/shardstock/shardstock/internal/stock"
)

// sweepTimeout bounds one sweep of a SKU's shards.
const sweepTimeout = 3 * time.Second

// sweepResult is what one sweep saw of a SKU.
type sweepResult struct {
	available int64 // sum over the shards that answered
	maxShard  int64 // the most any one shard holds
	inTransit int64
	unknown   int // shards that did not answer
	err       *stock.Error
}

// sweeper runs sweeps single-flight per SKU. A request joins only a sweep
// that starts after it arrived: the one queued behind the sweep in flight,
// or a new one. So every answer it gets was read during the request, which
// is what "no false sold-out" needs; and a sell-out storm costs one sweep
// in flight and one queued per SKU, whatever the request rate.
type sweeper struct {
	a     *Allocator
	mu    sync.Mutex
	bySKU map[string]*sweepState
}

type sweepState struct {
	running, next *sweepRun
}

type sweepRun struct {
	done chan struct{}
	res  sweepResult
}

func (s *sweeper) sweep(ctx context.Context, sku *stock.SKU) sweepResult {
	s.mu.Lock()
	if s.bySKU == nil {
		s.bySKU = map[string]*sweepState{}
	}
	st := s.bySKU[sku.SKU]
	if st == nil {
		st = &sweepState{}
		s.bySKU[sku.SKU] = st
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
	s.mu.Unlock()
	select {
	case <-run.done:
		return run.res
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
		s.mu.Unlock()
		run.res = s.a.sweepOnce(sku)
		s.a.metrics.sweeps.Inc()
		close(run.done)
		s.mu.Lock()
		st.running, st.next = st.next, nil
		if st.running == nil {
			delete(s.bySKU, sku.SKU)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// sweepOnce asks every shard server of the SKU for its shards' counts (they
// answer from memory) and the database for stock in transit.
func (a *Allocator) sweepOnce(sku *stock.SKU) sweepResult {
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	defer cancel()
	byServer := map[*serverClient][]int32{}
	var res sweepResult
	for i := int32(0); i < sku.Shards; i++ {
		c := a.client(stock.ShardKey{SKU: sku.SKU, Index: i})
		if c == nil {
			res.unknown++
			continue
		}
		byServer[c] = append(byServer[c], i)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c, idx := range byServer {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.client.GetShards(ctx, connect.NewRequest(&v1.GetShardsRequest{Sku: sku.SKU, Shards: idx}))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				a.log.Debug("sweep: shard server did not answer", "server", c.id, "err", rpc.FromConnect(err))
				res.unknown += len(idx)
				return
			}
			for _, s := range resp.Msg.GetShards() {
				a.setHint(stock.ShardKey{SKU: sku.SKU, Index: s.GetIndex()}, s.GetAvailable())
				res.available += s.GetAvailable()
				res.maxShard = max(res.maxShard, s.GetAvailable())
			}
		}()
	}
	wg.Wait()
	n, err := a.db.InTransit(ctx, sku.SKU)
	if err != nil {
		res.err = stock.Errorf(stock.CodeShardUnavailable, "could not read stock in transit; retry with the same key")
	}
	res.inTransit = n
	return res
}
