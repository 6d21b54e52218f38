package allocator

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestChecker_KeysOverflow: requests that join a check share its round
// trip, and the keys it looks up are bounded. A request whose key did not
// fit gets no lookup (ops nil), so outOfStock answers it SHARD_UNAVAILABLE
// (retry) rather than an OUT_OF_STOCK that could hide its replay.
func TestChecker_KeysOverflow(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewMigratedDB(t)
	db, err := postgres.Open(ctx, url, postgres.Options{MaxConns: 4, ApplicationName: "checktest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	sku := &stock.SKU{Name: "check-sku", Status: stock.StatusActive, Shards: 2, ReservationTTL: stock.ReservationTTLDefault}
	if err := db.CreateSKU(ctx, *sku, 0); err != nil {
		t.Fatal(err)
	}
	a := New(Config{DB: db, Topology: func() topology.View { return topology.View{} }})
	defer a.Close()
	const keysMax = 2
	a.checks.keysMax = keysMax

	// Hold the shards table so that the first check waits in the
	// database: the requests after it queue for the next one.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE shards IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	first := make(chan checkResult, 1)
	go func() { first <- a.checks.check(ctx, sku, "k-first") }()
	waitFor(t, func() bool { a.checks.mu.Lock(); defer a.checks.mu.Unlock(); return a.checks.bySKU[sku.Name] != nil })

	const joiners = keysMax + 2
	results := make([]checkResult, joiners)
	var wg sync.WaitGroup
	for i := range joiners {
		wg.Go(func() { results[i] = a.checks.check(ctx, sku, fmt.Sprintf("k-%d", i)) })
	}
	// Every joiner is queued behind the running check before it ends.
	waitFor(t, func() bool {
		a.checks.mu.Lock()
		defer a.checks.mu.Unlock()
		st := a.checks.bySKU[sku.Name]
		return st != nil && st.next != nil && len(st.next.keys) == keysMax
	})
	time.Sleep(50 * time.Millisecond) // the overflowing joiners reach the queue too
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-first; r.err != nil || r.ops == nil {
		t.Fatalf("first check = %+v, want its key looked up", r)
	}
	wg.Wait()
	looked, skipped := 0, 0
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("joiner %d: %v", i, r.err)
		case r.ops == nil:
			skipped++
			// And the allocator answers it as unchecked, not as sold out.
			res := a.outOfStock(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku.Name}, Quantity: 1,
				Key: fmt.Sprintf("k-%d", i)}, sku, false, r)
			if res.Err == nil || res.Err.Code != stock.CodeShardUnavailable {
				t.Errorf("outOfStock for an unchecked key = %v, want SHARD_UNAVAILABLE", res.Err)
			}
		default:
			looked++
		}
	}
	if looked != keysMax || skipped != joiners-keysMax {
		t.Errorf("%d joiners looked up and %d not, want %d and %d", looked, skipped, keysMax, joiners-keysMax)
	}
	var checks dto.Metric
	if err := a.metrics.checks.Write(&checks); err != nil {
		t.Fatal(err)
	}
	if got := checks.GetCounter().GetValue(); got != 2 {
		t.Errorf("%v checks, want 2: the running one and the one every joiner shared", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
