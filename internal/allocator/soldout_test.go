package allocator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// countingDB is the stack's database, counting the queries routing makes
// (every RouteStore call is one round trip).
type countingDB struct {
	*postgres.DB
	queries atomic.Int64
}

func (c *countingDB) GetSKU(ctx context.Context, sku string) (*stock.SKU, error) {
	c.queries.Add(1)
	return c.DB.GetSKU(ctx, sku)
}

func (c *countingDB) SoldOutCheck(ctx context.Context, sku string, keys []string) ([]stock.ShardRow, int64, map[string]*stock.Operation, error) {
	c.queries.Add(1)
	return c.DB.SoldOutCheck(ctx, sku, keys)
}

func (c *countingDB) GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error) {
	c.queries.Add(1)
	return c.DB.GetOperation(ctx, sku, key)
}

func (c *countingDB) LookupOperations(ctx context.Context, sku string, keys []string) (map[string]*stock.Operation, error) {
	c.queries.Add(1)
	return c.DB.LookupOperations(ctx, sku, keys)
}

func (c *countingDB) OperationKeys(ctx context.Context, sku string, limit int, each func(string)) (int, error) {
	c.queries.Add(1)
	return c.DB.OperationKeys(ctx, sku, limit, each)
}

// newMarked returns an allocator over the stack that follows and writes
// the sold-out marks (its own etcd client, as a process has), over db.
func (s *stack) newMarked(db allocator.Store) *allocator.Allocator {
	s.t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.etcd.Endpoints(), DialTimeout: 2 * time.Second})
	if err != nil {
		s.t.Fatal(err)
	}
	marks := topology.NewSoldOut(cli, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); marks.Run(ctx) }()
	a := allocator.New(allocator.Config{DB: db, Topology: s.topo, Logger: quiet(), SoldOut: marks,
		Rebalance: rebalance.Config{Off: true, Auto: rebalance.AutoShards{Off: true}}})
	s.t.Cleanup(func() {
		a.Close()
		cancel()
		<-done
		cli.Close()
	})
	return a
}

// untilFromMemory asks a for new keys of sku until it refuses one from
// memory, and returns how long that took.
func untilFromMemory(t *testing.T, a *allocator.Allocator, sku, prefix string) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		before := a.MemoryRefusals()
		res := a.Allocate(context.Background(), deduct(sku, fmt.Sprintf("%s-%d", prefix, i), 1))
		if codeOf(res) != stock.CodeOutOfStock {
			t.Fatalf("Allocate(deduct %s %s-%d) = %+v, want OUT_OF_STOCK", sku, prefix, i, res)
		}
		if a.MemoryRefusals() > before {
			return time.Since(start)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%s: no refusal from memory within 5 s of the sell-out", sku)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSoldOut: the sold-out answered from memory, on one stack.
//
// FromMemory: once a SKU is sold out for good, both allocators
// learn it within a second, and 10,000 requests with new keys cost no query
// and no shard call; a replayed key still gets its first result (and a
// key reused with other parameters its refusal); a replenish through one
// allocator reopens the SKU at the other at once.
func TestSoldOut(t *testing.T) {
	s := newStack(t, []string{"s1", "s2"}, "")
	t.Run("FromMemory", func(t *testing.T) { soldOutFromMemory(t, s) })
	t.Run("NeverWhileStockCanComeBack", func(t *testing.T) { soldOutNeverWhileStockCanComeBack(t, s) })
	t.Run("AbandonedReopen", func(t *testing.T) { soldOutAbandonedReopen(t, s) })
	t.Run("Tokens", func(t *testing.T) { soldOutTokens(t, s) })
	t.Run("TokensWaiting", func(t *testing.T) { soldOutTokensWaiting(t, s) })
	t.Run("TokensStalePending", func(t *testing.T) { soldOutTokensStalePending(t, s) })
}

func soldOutFromMemory(t *testing.T, s *stack) {
	ctx := context.Background()
	dbA, dbB := &countingDB{DB: s.db}, &countingDB{DB: s.db}
	a, b := s.newMarked(dbA), s.newMarked(dbB)
	const sku = "drop"
	s.createSKU(sku, 4, 4)
	for i := range 4 {
		if res := a.Allocate(ctx, deduct(sku, fmt.Sprint("sold-", i), 1)); res.Err != nil {
			t.Fatalf("Allocate(deduct sold-%d) = %v", i, res.Err)
		}
	}
	for name, al := range map[string]*allocator.Allocator{"A": a, "B": b} {
		if d := untilFromMemory(t, al, sku, "learn-"+name); d > time.Second {
			t.Errorf("allocator %s refused from memory %s after the sell-out, want within 1 s", name, d)
		}
	}

	const calls = 10000
	queries, shardCalls := dbA.queries.Load()+dbB.queries.Load(), a.ShardRequests()+b.ShardRequests()
	refusals := a.MemoryRefusals() + b.MemoryRefusals()
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for w := range 8 {
		al := a
		if w%2 == 1 {
			al = b
		}
		wg.Go(func() {
			for i := w; i < calls; i += 8 {
				if res := al.Allocate(ctx, deduct(sku, fmt.Sprint("new-", i), 1)); codeOf(res) != stock.CodeOutOfStock {
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Errorf("%d of %d deducts with new keys of a sold-out SKU not answered OUT_OF_STOCK", n, calls)
	}
	if got := dbA.queries.Load() + dbB.queries.Load() - queries; got != 0 {
		t.Errorf("%d calls with new keys made %d queries, want 0", calls, got)
	}
	if got := a.ShardRequests() + b.ShardRequests() - shardCalls; got != 0 {
		t.Errorf("%d calls with new keys made %v shard calls, want 0", calls, got)
	}
	if got := a.MemoryRefusals() + b.MemoryRefusals() - refusals; got != calls {
		t.Errorf("%v refusals from memory, want %d", got, calls)
	}

	// A key applied before the sell-out gets its first result, at either
	// allocator; with other parameters, its refusal.
	first := a.Allocate(ctx, deduct(sku, "sold-1", 1))
	if res := b.Allocate(ctx, deduct(sku, "sold-1", 1)); res.Err != nil || !res.Replayed || res.Operation.Shard != first.Operation.Shard {
		t.Errorf("Allocate(deduct sold-1) after the sell-out = %+v, want its first result replayed", res)
	}
	if res := b.Allocate(ctx, deduct(sku, "sold-2", 2)); codeOf(res) != stock.CodeIdempotencyKeyReused {
		t.Errorf("Allocate(deduct sold-2 2) after the sell-out = %+v, want IDEMPOTENCY_KEY_REUSED", res)
	}

	// A replenish through A reopens the SKU at B by the time it returns.
	start := time.Now()
	if res := a.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: sku}, Quantity: 2, Key: "restock"}); res.Err != nil {
		t.Fatalf("AdjustStock(replenish 2) = %v", res.Err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the replenish of a sold-out SKU took %s, want within 1 s", d)
	}
	if res := b.Allocate(ctx, deduct(sku, "after-restock", 2)); res.Err != nil {
		t.Errorf("Allocate(deduct 2) at B once a replenish of 2 through A returned = %v, want success", res.Err)
	}

	// Sold out again: a refund through A brings a unit back, and B sells
	// it the moment the refund returns (a refund that did not take the
	// mark away would leave B refusing from memory).
	untilFromMemory(t, b, sku, "relearn")
	if res := a.Refund(ctx, &stock.Request{Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: "refund-sold-0",
		Original: stock.Sale{DeductKey: "sold-0"}, Reason: "payment failed"}); res.Err != nil {
		t.Fatalf("Refund(1 of sold-0) of a sold-out SKU = %v", res.Err)
	}
	if res := b.Allocate(ctx, deduct(sku, "after-refund", 1)); res.Err != nil {
		t.Errorf("Allocate(deduct 1) at B once a refund of 1 through A returned = %v, want success", res.Err)
	}
	s.balanced(sku)
}

// NeverWhileStockCanComeBack: while a unit is held (then
// released, or left to expire) or in transit, no allocator refuses from
// memory, although every request is refused; once the unit is back, both
// sell it at once. And a replenish racing the marks (through one
// allocator, the other asked the moment it returns) is never refused. A
// mark made from a check that ignored holds or stock in transit, or a
// replenish that did not take the mark away, fails it.
func soldOutNeverWhileStockCanComeBack(t *testing.T, s *stack) {
	ctx := context.Background()
	a, b := s.newMarked(s.db), s.newMarked(s.db)
	both := []*allocator.Allocator{a, b}
	const sku = "comeback"
	s.createSKU(sku, 2, 2) // 1 on each shard
	refusals := func() float64 { return a.MemoryRefusals() + b.MemoryRefusals() }
	n := 0
	key := func(p string) string { n++; return fmt.Sprintf("%s-%d", p, n) }
	// refusedMeanwhile asks both allocators for 2 units, more than could
	// come back, with new keys for d: every answer must be a refusal (each
	// a sold-out check, which would ask for a mark), none from memory.
	refusedMeanwhile := func(what string, d time.Duration) {
		t.Helper()
		before := refusals()
		for end := time.Now().Add(d); time.Now().Before(end); {
			for _, al := range both {
				if res := al.Allocate(ctx, deduct(sku, key("while"), 2)); codeOf(res) != stock.CodeOutOfStock {
					t.Fatalf("Allocate(deduct 2) while %s = %+v, want OUT_OF_STOCK", what, res)
				}
			}
		}
		if got := refusals() - before; got != 0 {
			t.Fatalf("%v refusals from memory while %s, want none: a unit could still come back", got, what)
		}
	}
	// sellBoth sells one unit through each allocator: the units are back.
	sellBoth := func(what string) {
		t.Helper()
		for i, al := range both {
			if res := al.Allocate(ctx, deduct(sku, key("after"), 1)); res.Err != nil {
				t.Fatalf("allocator %d: Allocate(deduct 1) once %s = %v, want success", i, what, res.Err)
			}
		}
	}
	// soldOutForGood waits until both allocators refuse from memory.
	soldOutForGood := func() {
		t.Helper()
		untilFromMemory(t, a, sku, key("a"))
		untilFromMemory(t, b, sku, key("b"))
	}
	reserveAll := func(ttl time.Duration) []string {
		t.Helper()
		var ids []string
		for range 2 {
			res := a.Allocate(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: key("hold"), TTL: ttl})
			if res.Err != nil {
				t.Fatalf("Allocate(reserve 1) = %v", res.Err)
			}
			ids = append(ids, res.Reservation.ID)
		}
		return ids
	}
	replenish := func(al *allocator.Allocator, q int64) {
		t.Helper()
		if res := al.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: sku}, Quantity: q, Key: key("restock")}); res.Err != nil {
			t.Fatalf("AdjustStock(replenish %d) = %v", q, res.Err)
		}
	}

	// Held, then released.
	ids := reserveAll(0)
	refusedMeanwhile("held", 400*time.Millisecond)
	for _, id := range ids {
		if res := b.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: id}); res.Err != nil {
			t.Fatalf("EndReservation(release %s) = %v", id, res.Err)
		}
	}
	sellBoth("released")
	soldOutForGood()

	// Replenished through one allocator, sold through the other the moment
	// it returns, a few times each way.
	for i := range 2 {
		replenish(both[i%2], 2)
		if res := both[(i+1)%2].Allocate(ctx, deduct(sku, key("race"), 2)); res.Err != nil {
			t.Fatalf("Allocate(deduct 2) at the other allocator once a replenish of 2 returned = %v, want success", res.Err)
		}
		soldOutForGood()
	}

	// Held, then expired (the shard servers' expiry sweep: no allocator is
	// told).
	replenish(a, 2)
	reserveAll(stock.ReservationTTLMin)
	refusedMeanwhile("held until expiry", 400*time.Millisecond)
	waitUntil(t, func() bool {
		st, err := a.GetStock(ctx, sku)
		return err == nil && st.Total.Reserved == 0
	})
	sellBoth("expired")
	soldOutForGood()

	// In transit: debited from shard 0, not yet credited to shard 1.
	replenish(a, 1)
	from := stock.ShardKey{SKU: sku, Index: 0}
	if st, err := a.GetStock(ctx, sku); err != nil || st.Shards[0].Available != 1 {
		// The replenish went to shard 1: move from there.
		from.Index = 1
	}
	tr := &stock.Transfer{ID: stock.NewTransferID(), SKU: sku, From: from.Index, To: 1 - from.Index, Quantity: 1, Reason: "test"}
	if err := s.db.CreateTransfer(ctx, tr); err != nil {
		t.Fatal(err)
	}
	if res := s.owner(from).Do(ctx, &stock.Request{Kind: stock.OpTransferOut, Shard: from, TransferID: tr.ID, Source: stock.SourceAPI}); res.Err != nil {
		t.Fatalf("transfer out = %v", res.Err)
	}
	refusedMeanwhile("in transit", 400*time.Millisecond)
	to := stock.ShardKey{SKU: sku, Index: tr.To}
	if res := s.owner(to).Do(ctx, &stock.Request{Kind: stock.OpTransferIn, Shard: to, TransferID: tr.ID, Source: stock.SourceAPI}); res.Err != nil {
		t.Fatalf("transfer in = %v", res.Err)
	}
	if res := b.Allocate(ctx, deduct(sku, key("landed"), 1)); res.Err != nil {
		t.Fatalf("Allocate(deduct 1) once the transfer landed = %v, want success", res.Err)
	}
	s.balanced(sku)
}

// AbandonedReopen: an allocator that took a SKU's mark away and died
// before it sent its replenish (or whose replenish is in doubt) leaves
// its reopen recorded. No allocator trusts the mark any more, the SKU is
// not marked again while the reopen is pending, and the next marking
// finishes it: the replenish is sent again with its key and applied once.
func soldOutAbandonedReopen(t *testing.T, s *stack) {
	ctx := context.Background()
	a := s.newMarked(s.db)
	const sku = "abandoned"
	s.createSKU(sku, 2, 1)
	if res := a.Allocate(ctx, deduct(sku, "only", 1)); res.Err != nil {
		t.Fatalf("Allocate(deduct only) = %v", res.Err)
	}
	untilFromMemory(t, a, sku, "marked")

	dead := topology.NewSoldOut(s.etcd.Client(), quiet())
	rec, err := json.Marshal(&stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: sku}, Quantity: 3, Key: "lost-restock", Source: stock.SourceAPI})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Reopen(ctx, sku, "lost-restock", rec); err != nil {
		t.Fatal(err)
	}
	// The allocator stops answering from the mark, then the marking it
	// asks for finishes the reopen: the units come.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; ; i++ {
		res := a.Allocate(ctx, deduct(sku, fmt.Sprint("after-", i), 1))
		if res.Err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Allocate(deduct 1) = %v 5 s after a reopen was abandoned, want the reopen finished and a unit sold", res.Err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	op, err := a.GetOperation(ctx, sku, "lost-restock")
	if err != nil || op.Kind != stock.OpReplenish || op.Quantity != 3 {
		t.Errorf("GetOperation(lost-restock) = %+v, %v, want the replenish of 3 applied", op, err)
	}
	resp, err := s.etcd.Client().Get(ctx, "/shardstock/reopen/"+sku+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("pending reopens of %s after it was finished: %v, %v, want none", sku, resp, err)
	}
	s.balanced(sku)
}
