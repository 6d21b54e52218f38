package allocator_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// newMover returns an allocator over the stack that moves stock under move
// leases of its own (holder id), with cfg as its rebalancer's.
func (s *stack) newMover(id string, cfg rebalance.Config) (*allocator.Allocator, *topology.MoveLeases) {
	s.t.Helper()
	return s.newMoverIn(id, cfg, nil)
}

// newMoverIn is newMover with the allocator's metrics registered in reg.
func (s *stack) newMoverIn(id string, cfg rebalance.Config, reg prometheus.Registerer) (*allocator.Allocator, *topology.MoveLeases) {
	s.t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.etcd.Endpoints(), DialTimeout: 2 * time.Second})
	if err != nil {
		s.t.Fatal(err)
	}
	moves := topology.NewMoveLeases(cli, id, time.Second, quiet())
	a := allocator.New(allocator.Config{DB: s.db, Topology: s.topo, Logger: quiet(), Moves: moves, Rebalance: cfg, Registerer: reg})
	s.t.Cleanup(func() {
		a.Close()
		moves.Close()
		cli.Close()
	})
	return a, moves
}

// quietRebalancer: no background rounds, only what a test asks for.
var quietRebalancer = rebalance.Config{Off: true, Auto: rebalance.AutoShards{Off: true}, RetireGrace: 200 * time.Millisecond}

// owner returns the shard server that owns shard k now.
func (s *stack) owner(k stock.ShardKey) interface {
	Do(context.Context, *stock.Request) stock.Result
} {
	s.t.Helper()
	srv, _, ok := s.topo().Owner(k.Partition())
	if !ok {
		s.t.Fatalf("no owner of %s", k)
	}
	return s.servers[srv.ID]
}

// A mover whose lease has gone (revoked here, as an expiry or a partition
// would end it) can neither create a transfer nor debit one it created
// before, once a newer mover took the SKU over: the database refuses the
// creation and the source's writer aborts the debit. Without the writer's
// check (plan.go's MoveFences case and the step's fence clause) the old
// transfer is debited: this test fails.
func TestRebalance_StaleHolderFenced(t *testing.T) {
	s := newStack(t, []string{"s1", "s2"}, "")
	ctx := context.Background()
	s.createSKU("fenced", 2, 100) // 50 and 50
	_, movesA := s.newMover("alloc-a", quietRebalancer)
	b, _ := s.newMover("alloc-b", quietRebalancer)
	// 50 and 10: B has something to move when it takes over.
	if r := s.alloc.Allocate(ctx, deduct("fenced", keyFor(t, "fenced-sale", 2, 1), 40)); r.Err != nil {
		t.Fatal(r.Err)
	}

	la, err := movesA.TryAcquire(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.RaiseMoveFence(ctx, "fenced", la.Token, la.Holder); err != nil {
		t.Fatal(err)
	}
	early := &stock.Transfer{ID: stock.NewTransferID(), SKU: "fenced", From: 0, To: 1, Quantity: 10, FenceToken: la.Token, Reason: "test"}
	if err := s.db.CreateTransfer(ctx, early); err != nil {
		t.Fatalf("CreateTransfer under the live lease = %v", err)
	}

	// A's lease ends; B takes the SKU (its Rebalance raises the fence).
	lease := leaseOf(t, s, "fenced")
	cli := s.etcd.Client()
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	select {
	case <-la.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("A's lease not lost after its revocation")
	}
	if ts, err := b.Rebalance(ctx, "fenced", false); err != nil || len(ts) == 0 {
		t.Fatalf("B's Rebalance = %d transfers, %v, want it to move", len(ts), err)
	}

	// A, stale, creates: refused, nothing written.
	late := &stock.Transfer{ID: stock.NewTransferID(), SKU: "fenced", From: 0, To: 1, Quantity: 10, FenceToken: la.Token, Reason: "test"}
	if err := s.db.CreateTransfer(ctx, late); stock.CodeOf(err) != stock.CodeMoveFenced {
		t.Errorf("stale CreateTransfer = %v, want MOVE_FENCED", err)
	}
	if _, err := s.db.GetTransfer(ctx, late.ID); err == nil {
		t.Errorf("the stale holder's transfer was written")
	}
	// A, stale, debits the transfer it created in time: aborted, no unit moves.
	before := s.available("fenced")
	src := stock.ShardKey{SKU: "fenced", Index: 0}
	res := s.owner(src).Do(ctx, &stock.Request{Kind: stock.OpTransferOut, Shard: src, TransferID: early.ID, Source: stock.SourceRebalancer})
	if res.Err == nil || res.Err.Code != stock.CodeMoveFenced {
		t.Errorf("stale debit = %+v, want MOVE_FENCED", res)
	}
	got, err := s.db.GetTransfer(ctx, early.ID)
	if err != nil || got.State != stock.TransferAborted {
		t.Errorf("stale transfer after its debit = %+v, %v, want aborted", got, err)
	}
	if after := s.available("fenced"); !slices.Equal(before, after) {
		t.Errorf("available %v -> %v across a refused debit", before, after)
	}
	var total int64
	for _, n := range s.available("fenced") {
		total += n
	}
	if total != 60 {
		t.Errorf("available after the moves = %d, want 60", total)
	}
	s.balanced("fenced")
}

// leaseOf returns the etcd lease bound to a SKU's move-lease key.
func leaseOf(t *testing.T, s *stack, sku string) clientv3.LeaseID {
	t.Helper()
	resp, err := s.etcd.Client().Get(context.Background(), "/shardstock/moves/"+sku)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("move lease key of %s: %v, %d keys", sku, err, len(resp.Kvs))
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// Two allocators asked to rebalance one SKU at once: one moves, the other
// answers REBALANCE_IN_PROGRESS or, coming after, finds nothing to move;
// the transfers of the two holders never overlap in time.
func TestRebalance_OneMoverAtOnce(t *testing.T) {
	s := newStack(t, []string{"s1", "s2"}, "")
	ctx := context.Background()
	a, _ := s.newMover("alloc-a", quietRebalancer)
	b, _ := s.newMover("alloc-b", quietRebalancer)
	for round := range 5 {
		sku := fmt.Sprintf("once-%d", round)
		s.createSKU(sku, 8, 0)
		if r := a.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: sku}, Quantity: 8000, Key: "fill-" + sku}); r.Err != nil {
			t.Fatal(r.Err)
		}
		var moved [2][]*stock.Transfer
		var errs [2]error
		var wg sync.WaitGroup
		for i, al := range []*allocator.Allocator{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				moved[i], errs[i] = al.Rebalance(ctx, sku, false)
			}()
		}
		wg.Wait()
		movers := 0
		for i := range 2 {
			switch {
			case errs[i] == nil && len(moved[i]) > 0:
				movers++
			case errs[i] == nil, stock.CodeOf(errs[i]) == stock.CodeRebalanceInProgress:
			default:
				t.Errorf("round %d: Rebalance = %v", round, errs[i])
			}
		}
		if movers != 1 {
			t.Errorf("round %d: %d allocators moved stock, want 1 (errors %v)", round, movers, errs)
		}
		ts, err := a.ListTransfers(ctx, stock.TransferFilter{SKU: sku}, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		byToken := map[int64][2]time.Time{}
		for _, tr := range ts {
			span, ok := byToken[tr.FenceToken]
			if !ok || tr.CreatedAt.Before(span[0]) {
				span[0] = tr.CreatedAt
			}
			if tr.UpdatedAt.After(span[1]) {
				span[1] = tr.UpdatedAt
			}
			byToken[tr.FenceToken] = span
		}
		var spans [][2]time.Time
		for _, sp := range byToken {
			spans = append(spans, sp)
		}
		slices.SortFunc(spans, func(x, y [2]time.Time) int { return x[0].Compare(y[0]) })
		for i := 1; i < len(spans); i++ {
			if spans[i][0].Before(spans[i-1][1]) {
				t.Errorf("round %d: two holders' transfers overlap: %v and %v", round, spans[i-1], spans[i])
			}
		}
		s.balanced(sku)
	}
}

// A one-shard SKU split to 8 holds stock on most of its shards within
// seconds, with nothing asked of it.
func TestRebalance_SplitSpreads(t *testing.T) {
	s := newStack(t, []string{"s1", "s2"}, "")
	ctx := context.Background()
	a, _ := s.newMover("alloc-a", quietRebalancer)
	s.createSKU("split8", 1, 8000)
	st, err := a.SetShards(ctx, "split8", 8)
	if err != nil || st.SKU.Shards != 8 || len(st.Shards) != 8 {
		t.Fatalf("SetShards(8) = %+v, %v", st, err)
	}
	start := time.Now()
	for {
		holding := 0
		for _, n := range s.available("split8") {
			if n > 0 {
				holding++
			}
		}
		if holding >= 6 {
			t.Logf("stock on %d of 8 shards %s after SetShards", holding, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("stock on %d of 8 shards 5 s after SetShards: %v", holding, s.available("split8"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.balanced("split8")
	// The split goes on after six shards hold stock: let the transfers in
	// flight land (a CI run read 7,000 with 1,000 in transit), then every
	// unit must be on a shard.
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		st, err := a.GetStock(ctx, "split8")
		if err == nil && st.InTransit == 0 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("units still in transit 5 s after the split: %+v, %v", st, err)
		}
	}
	var total int64
	for _, n := range s.available("split8") {
		total += n
	}
	if total != 8000 {
		t.Errorf("available after the split = %d, want 8000", total)
	}
}

// Skewed demand: every request's first choice is one of 2 of 16 shards.
// The SKU sells out exactly and no OUT_OF_STOCK is answered while units
// remain, with the rebalancer off and on. With it on, routing sends far
// fewer requests away from their first choice, and needs no more sold-out checks
// and consolidations. (Off, the hints already route around empty shards
// without a sold-out check until the last units: most sold-out checks are the sell-out's
// own, one per refusal, and the same either way.)
func TestRebalance_SkewedDemand(t *testing.T) {
	s := newStack(t, []string{"s1", "s2"}, "")
	on := quietRebalancer
	on.Off, on.Interval = false, 50*time.Millisecond
	counts := map[bool]routing{}
	for _, rebalancing := range []bool{false, true} {
		cfg := quietRebalancer
		if rebalancing {
			cfg = on
		}
		reg := prometheus.NewRegistry()
		a, _ := s.newMoverIn(fmt.Sprintf("alloc-%v", rebalancing), cfg, reg)
		sku := fmt.Sprintf("skew-%v", rebalancing)
		s.createSKU(sku, 16, 8000)
		counts[rebalancing] = sellSkewed(t, a, reg, sku, 8000)
		s.balanced(sku)
	}
	off, on2 := counts[false], counts[true]
	t.Logf("routing needed, rebalancer off: %.0f sold-out checks, %.0f consolidations, %.0f reroutes; on: %.0f sold-out checks, %.0f consolidations, %.0f reroutes",
		off[0], off[1], off[2], on2[0], on2[1], on2[2])
	// Measured on 2 cores: about a sixth when the machine is quiet, 0.26
	// under a parallel load test (the rebalancer's rounds and the load share
	// the CPU); a rebalancer that moves nothing stays near 1.
	if on2[2] > off[2]/2 {
		t.Errorf("with the rebalancer on, %.0f reroutes, off %.0f: want at most half", on2[2], off[2])
	}
	// The sell-out's own sold-out checks (one per client refused, shared when they
	// coincide) vary from run to run: on 2026-12-05, off's sum went from 9 to 23
	// and on's from 21 to 33 over six runs (one CI run failed a margin of 16 at
	// 29 against 9). A rebalancer that made routing check more would add tens.
	const soldOutChecksNoise = 24
	if on2[0]+on2[1] > off[0]+off[1]+soldOutChecksNoise {
		t.Errorf("with the rebalancer on, %.0f sold-out checks and consolidations, off %.0f: want no more", on2[0]+on2[1], off[0]+off[1])
	}
}

// sellSkewed deducts from 8 clients, keys whose first choice is shard 0 or
// 1, quantities 1 to 3 until a client is refused, then 1, until each is
// refused one unit. It checks that exactly initial sold and that no
// OUT_OF_STOCK of q came before a success of q or more that started after
// it (the stock only goes down: the refusal was false), and returns the
// sold-out checks and consolidations the allocator needed.
func sellSkewed(t *testing.T, a *allocator.Allocator, g prometheus.Gatherer, sku string, initial int64) routing {
	t.Helper()
	reg := metricsOf(t, a, g)
	before := reg()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type refusal struct {
		q   int64
		end time.Time
	}
	type success struct {
		q     int64
		start time.Time
	}
	var sold, next atomic.Int64
	var mu sync.Mutex
	var refusals []refusal
	var successes []success
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refused := false
			for ctx.Err() == nil {
				n := next.Add(1)
				q := 1 + n%3
				if refused {
					q = 1
				}
				key := keyFor(t, fmt.Sprintf("%s-%d-", sku, n), 16, int32(n%2))
				start := time.Now()
				res := a.Allocate(ctx, deduct(sku, key, q))
				mu.Lock()
				switch code := codeOf(res); code {
				case "":
					sold.Add(q)
					successes = append(successes, success{q, start})
				case stock.CodeOutOfStock:
					refusals = append(refusals, refusal{q, time.Now()})
				case stock.CodeShardUnavailable:
				default:
					t.Errorf("deduct: %v", res.Err)
				}
				mu.Unlock()
				if code := codeOf(res); code == stock.CodeOutOfStock {
					if q == 1 {
						return
					}
					refused = true
				}
			}
		}()
	}
	wg.Wait()
	if sold.Load() != initial {
		t.Errorf("%s: sold %d, want %d", sku, sold.Load(), initial)
	}
	for _, r := range refusals {
		for _, s := range successes {
			if s.q >= r.q && s.start.After(r.end) {
				t.Errorf("%s: OUT_OF_STOCK for %d at %s, yet %d sold in a request started at %s", sku, r.q, r.end, s.q, s.start)
				return reg().minus(before)
			}
		}
	}
	return reg().minus(before)
}

// routing is what routing needed: sold-out checks, consolidations, reroutes.
type routing [3]float64

// metricsOf returns a reader of an allocator's routing counts; the
// consolidations are its rebalancer's, read from g, where it registered.
func metricsOf(t *testing.T, a *allocator.Allocator, g prometheus.Gatherer) func() routing {
	return func() routing {
		sw, re := a.RoutingCounts()
		var co float64
		mfs, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "shardstock_allocator_consolidations_total" {
				co = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return routing{sw, co, re}
	}
}

func (r routing) minus(o routing) routing { return routing{r[0] - o[0], r[1] - o[1], r[2] - o[2]} }

// A SKU asked for more than the split rate per shard, round after round,
// gets twice its shards, and goes back to the count it had once it has
// been cold for MergeAfter; a SKU whose auto_shards is off is left alone.
func TestRebalance_AutoShards(t *testing.T) {
	s := newStack(t, []string{"s1", "s2"}, "")
	ctx := context.Background()
	cfg := quietRebalancer
	cfg.Interval = 100 * time.Millisecond
	cfg.Auto = rebalance.AutoShards{SplitRatePerShard: 50, SplitAfter: 300 * time.Millisecond, ShardsMax: 4, MergeAfter: 2 * time.Second}
	reg := prometheus.NewRegistry()
	a, _ := s.newMoverIn("alloc-auto", cfg, reg)
	s.createSKU("hot", 1, 100000)
	s.createSKU("pinned", 1, 100000)
	off := false
	if _, err := a.UpdateSKU(ctx, "pinned", stock.SKUUpdate{AutoShards: &off}); err != nil {
		t.Fatal(err)
	}
	shards := func(sku string) int32 {
		st, err := a.GetStock(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		return st.SKU.Shards
	}
	// About 400 units a second on each: 8 times the split rate per shard.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, sku := range []string{"hot", "pinned"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				if r := a.Allocate(ctx, deduct(sku, fmt.Sprintf("%s-%d", sku, n), 4)); r.Err != nil && r.Err.Code != stock.CodeShardUnavailable {
					t.Errorf("deduct on %s: %v", sku, r.Err)
				}
			}
		}()
	}
	deadline := time.Now().Add(15 * time.Second)
	for shards("hot") < 4 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if got := shards("hot"); got != 4 {
		t.Fatalf("hot SKU has %d shards after 15 s above the split rate, want 4 (split twice, up to ShardsMax)", got)
	}
	if got := shards("pinned"); got != 1 {
		t.Errorf("SKU with auto_shards off has %d shards, want 1", got)
	}
	// Cold now: merged back halfway each MergeAfter, to the 1 it had.
	deadline = time.Now().Add(20 * time.Second)
	for shards("hot") > 1 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if got := shards("hot"); got != 1 {
		t.Errorf("hot SKU has %d shards after 20 s cold, want 1", got)
	}
	s.balanced("hot")
	s.balanced("pinned")
	// Two splits and two merges, each counted once, as the automatic
	// split and merge's: none as SetShards'.
	reshards := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "shardstock_rebalancer_reshards_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			reshards[key] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"by=auto direction=split ": 2, "by=auto direction=merge ": 2}
	if !maps.Equal(reshards, want) {
		t.Errorf("shardstock_rebalancer_reshards_total = %v, want %v", reshards, want)
	}
}
