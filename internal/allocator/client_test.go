package allocator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/wire"
)

// gatedShard is a ShardService that holds every Execute call until its
// gate opens, except that ops keyed "slow-..." wait for slow to close
// instead; it counts the calls and the ops it was sent.
type gatedShard struct {
	shardstockv1connect.UnimplementedShardServiceHandler
	gate, slow chan struct{}
	mu         sync.Mutex
	calls, ops int
}

func (g *gatedShard) Execute(ctx context.Context, req *connect.Request[v1.ExecuteRequest]) (*connect.Response[v1.ExecuteResponse], error) {
	g.mu.Lock()
	g.calls++
	g.ops += len(req.Msg.GetOps())
	g.mu.Unlock()
	wait := g.gate
	out := &v1.ExecuteResponse{}
	for _, op := range req.Msg.GetOps() {
		r := wire.RequestFromProto(op)
		if strings.HasPrefix(r.Key, "slow-") {
			wait = g.slow
		}
		out.Results = append(out.Results, wire.ResultToProto(stock.Result{Operation: &stock.Operation{SKU: r.Shard.SKU, IdempotencyKey: r.Key,
			Kind: r.Kind, Quantity: r.Quantity, Shard: r.Shard.Index}}))
	}
	select {
	case <-wait:
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	return connect.NewResponse(out), nil
}

func (g *gatedShard) counts() (calls, ops int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls, g.ops
}

// gatedAllocator is an allocator whose one shard server, s1, is g; it
// returns the allocator's client of s1 too.
func gatedAllocator(t *testing.T, g *gatedShard) (*Allocator, *serverClient) {
	t.Helper()
	e := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	w := topology.NewWatcher(e.Client(), stock.Partitions)
	go w.Run(ctx)
	t.Cleanup(cancel)
	addr := serveShard(t, g)
	member(t, e, "s1", addr)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := w.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	a := New(Config{Topology: w.Snapshot}) // no database: no rebalancer rounds
	t.Cleanup(a.Close)
	return a, a.remote(topology.Server{ID: "s1", Addr: addr})
}

// execAsync runs a.exec of a deduct keyed key on shard idx of sku.
func execAsync(a *Allocator, sku string, idx int32, key string) <-chan stock.Result {
	out := make(chan stock.Result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out <- a.exec(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: 1, Key: key, Source: stock.SourceAPI})
	}()
	return out
}

func executeCalls(t *testing.T, a *Allocator, id string) int {
	t.Helper()
	var m dto.Metric
	if err := a.metrics.calls.WithLabelValues(id).Write(&m); err != nil {
		t.Fatal(err)
	}
	return int(m.GetCounter().GetValue())
}

// TestServerClient_Coalesces: while rpcsSteady calls are in flight to a
// shard server, the ops that arrive wait and then go in as few calls, not
// one call each.
func TestServerClient_Coalesces(t *testing.T) {
	g := &gatedShard{gate: make(chan struct{}), slow: make(chan struct{})}
	a, s1 := gatedAllocator(t, g)
	// The first calls are held by the gate as long as the test takes to
	// queue the rest: they must not give their places up meanwhile
	// (rpcSlotHoldMax, TestServerClient_SlowCallGivesWay), which they did
	// on a loaded machine (4 calls while 2 were in flight).
	s1.holdMax = time.Hour
	var first []<-chan stock.Result
	for i := range rpcsSteady {
		first = append(first, execAsync(a, "co", int32(i), fmt.Sprintf("first-%d", i)))
		waitFor(t, func() bool { c, _ := g.counts(); return c == i+1 })
	}
	const queued = 40
	var rest []<-chan stock.Result
	for i := range queued {
		rest = append(rest, execAsync(a, "co", int32(i%8), fmt.Sprintf("queued-%d", i)))
	}
	waitFor(t, func() bool {
		s1.mu.Lock()
		defer s1.mu.Unlock()
		return len(s1.pending) == rpcsSteady+queued
	})
	time.Sleep(20 * time.Millisecond) // a loop that would send them one by one has had its chance
	if c, _ := g.counts(); c != rpcsSteady {
		t.Errorf("Execute calls while %d were in flight = %d, want %d: the queued ops did not wait", rpcsSteady, c, rpcsSteady)
	}
	close(g.gate)
	for _, ch := range append(first, rest...) {
		if res := <-ch; res.Err != nil {
			t.Fatalf("exec = %v", res.Err)
		}
	}
	calls, ops := g.counts()
	if ops != rpcsSteady+queued {
		t.Errorf("ops sent = %d, want %d", ops, rpcsSteady+queued)
	}
	// The queued ops go in whatever calls the freed places make: at most
	// one per place, and never one per op.
	if calls > 2*rpcsSteady {
		t.Errorf("Execute calls = %d for %d ops, want at most %d", calls, ops, 2*rpcsSteady)
	}
	if n := executeCalls(t, a, "s1"); n != calls {
		t.Errorf("shardstock_allocator_execute_calls_total = %d, want %d", n, calls)
	}
}

// TestServerClient_SlowCallGivesWay: calls slower than rpcSlotHoldMax give
// their places up, so a slow op holds the server's other ops back by about
// that much, not until it ends.
func TestServerClient_SlowCallGivesWay(t *testing.T) {
	g := &gatedShard{gate: make(chan struct{}), slow: make(chan struct{})}
	close(g.gate) // only the slow ops wait
	a, _ := gatedAllocator(t, g)
	var slow []<-chan stock.Result
	for i := range rpcsSteady {
		slow = append(slow, execAsync(a, "sl", int32(i), fmt.Sprintf("slow-%d", i)))
		waitFor(t, func() bool { c, _ := g.counts(); return c == i+1 })
	}
	start := time.Now()
	select {
	case res := <-execAsync(a, "sl", 5, "fast"):
		if res.Err != nil {
			t.Fatalf("exec(fast) = %v", res.Err)
		}
		t.Logf("a fast op beside %d slow calls answered in %s", rpcsSteady, time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * rpcSlotHoldMax):
		t.Fatalf("a fast op waited %s behind %d slow calls, want about %s", 10*rpcSlotHoldMax, rpcsSteady, rpcSlotHoldMax)
	}
	close(g.slow)
	for _, ch := range slow {
		if res := <-ch; res.Err != nil {
			t.Fatalf("exec(slow) = %v", res.Err)
		}
	}
}
