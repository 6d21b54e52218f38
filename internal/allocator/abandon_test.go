package allocator

import (
	"context"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// hungShard is a ShardService that never answers (a stopped server) when
// hung, and otherwise answers every op with success and available.
type hungShard struct {
	shardstockv1connect.UnimplementedShardServiceHandler
	hung      bool
	available int64
}

func (h *hungShard) Execute(ctx context.Context, req *connect.Request[v1.ExecuteRequest]) (*connect.Response[v1.ExecuteResponse], error) {
	if h.hung {
		<-ctx.Done()
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	out := &v1.ExecuteResponse{}
	for _, op := range req.Msg.GetOps() {
		r := wire.RequestFromProto(op)
		res := stock.Result{Operation: &stock.Operation{SKU: r.Shard.SKU, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, Shard: r.Shard.Index}, Available: h.available}
		out.Results = append(out.Results, wire.ResultToProto(res))
	}
	return connect.NewResponse(out), nil
}

// serveShard serves h on a new local port and returns its address.
func serveShard(t *testing.T, h shardstockv1connect.ShardServiceHandler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, handler := shardstockv1connect.NewShardServiceHandler(h)
		transport.Serve(ctx, lis, handler)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return lis.Addr().String()
}

// member runs a topology member for a shard server until the returned
// function is called (a graceful stop: it releases its keys and revokes
// its lease).
func member(t *testing.T, e *etcdtest.Etcd, id, addr string) (stop func()) {
	t.Helper()
	m := topology.NewMember(topology.MemberConfig{Client: e.Client(), ServerID: id, Addr: addr, LeaseTTL: 2 * time.Second, Owner: nopOwner{}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

type nopOwner struct{}

func (nopOwner) Acquire(context.Context, int32, int64) error { return nil }
func (nopOwner) Lose(int32)                                  {}

// TestAllocator_AbandonMoved: a call waiting for a hung shard server is
// abandoned when its partition is handed to another server, and sent there
// with the same request; a call whose partition stays keeps waiting, also
// while other partitions are between release and claim; once the hung
// server's registration is gone, that one is abandoned too.
func TestAllocator_AbandonMoved(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := topology.NewWatcher(e.Client(), stock.Partitions)
	go w.Run(ctx)

	stopS1 := member(t, e, "s1", serveShard(t, &hungShard{hung: true}))
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := w.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	a := New(Config{Topology: w.Snapshot}) // no database: no rebalancer rounds
	defer a.Close()

	// One shard whose partition moves to s2 when it joins, one that stays.
	const sku = "abandon"
	want := topology.Assign(stock.Partitions, []string{"s1", "s2"})
	moving, staying := int32(-1), int32(-1)
	for i := int32(0); i < 64 && (moving < 0 || staying < 0); i++ {
		switch want[stock.PartitionOf(sku, i)] {
		case "s2":
			moving = i
		case "s1":
			staying = i
		}
	}
	if moving < 0 || staying < 0 {
		t.Fatalf("no shard of %s moves (%d) or stays (%d)", sku, moving, staying)
	}
	exec := func(idx int32) <-chan stock.Result {
		out := make(chan stock.Result, 1)
		go func() {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			r := &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: 1, Key: "k", Source: stock.SourceAPI}
			out <- a.exec(rctx, r)
		}()
		return out
	}
	movingRes, stayingRes := exec(moving), exec(staying)
	s1 := a.remote(topology.Server{ID: "s1", Addr: w.Snapshot().Servers()[0].Addr})
	waitFor(t, func() bool { s1.mu.Lock(); defer s1.mu.Unlock(); return len(s1.pending) == 2 })

	// s2 joins: the moving partition is released by s1 and claimed by s2.
	const s2Available = 7
	member(t, e, "s2", serveShard(t, &hungShard{available: s2Available}))
	select {
	case res := <-movingRes:
		if res.Err != nil || res.Available != s2Available {
			t.Errorf("exec(shard %d) after its partition moved to s2 = %+v, want s2's success (available %d)", moving, res, s2Available)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("exec(shard %d) still waits for hung s1 after its partition moved to s2", moving)
	}
	select {
	case res := <-stayingRes:
		t.Fatalf("exec(shard %d), whose partition s1 still owns, = %+v, want it to wait", staying, res)
	case <-time.After(100 * time.Millisecond):
	}
	if n := abandoned(t, a, "s1"); n != 1 {
		t.Errorf("abandoned calls to s1 = %d, want 1", n)
	}

	// s1 leaves: its registration goes with its lease.
	stopS1()
	select {
	case res := <-stayingRes:
		if res.Err != nil && res.Err.Code != stock.CodeShardUnavailable {
			t.Errorf("exec(shard %d) after s1 left = %+v, want s2's success or SHARD_UNAVAILABLE", staying, res)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("exec(shard %d) still waits for s1 after it left", staying)
	}
	if n := abandoned(t, a, "s1"); n != 2 {
		t.Errorf("abandoned calls to s1 = %d, want 2", n)
	}
	// Its client goes too, once nothing waits on it.
	waitFor(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range a.servers {
			if c.id == "s1" {
				return false
			}
		}
		return true
	})
}

func abandoned(t *testing.T, a *Allocator, id string) int {
	t.Helper()
	var m dto.Metric
	if err := a.metrics.abandoned.WithLabelValues(id).Write(&m); err != nil {
		t.Fatal(err)
	}
	return int(m.GetCounter().GetValue())
}
