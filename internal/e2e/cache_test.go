package e2e

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
)

// sharedStaleSKUCache (TestE2E_Shared/StaleSKUCache): the allocator caches
// a SKU's configuration, and so does each shard writer (as of its last
// batch), and another allocator may change it meanwhile (here: the
// database directly). A request larger than any one shard is refused on
// the SKU's configuration only after a fresh read: a SKU resumed elsewhere
// consolidates and sells, rather than answering SKU_PAUSED from the
// allocator's copy, or from that of a writer that last ran while the SKU
// was paused (a transfer of the rebalancer's tail policy, under load:
// TestShard_ConfigChangedElsewhere, TestAllocator_ResumedElsewhere).
// Answers the API asks a client to retry (a lease lost, a call timed out
// on a loaded machine) are retried with the same key; only definite ones
// are checked.
func sharedStaleSKUCache(t *testing.T, s *stack) {
	ctx, cancel := context.WithTimeout(context.Background(), staleRunTimeout)
	defer cancel()
	const sku = "stale-cache"
	s.createSKU(sku, 8, 8) // one unit on each shard
	deduct := func(key string, q int64) error {
		return untilDefinite(ctx, "Deduct("+key+")", func(ctx context.Context) error {
			_, err := s.deduct(ctx, sku, key, q)
			return err
		}, func(err error) bool { return !retryable(err) })
	}

	paused := true
	if _, err := s.admin.UpdateSku(ctx, adminReq(&v1.UpdateSkuRequest{Sku: sku, Paused: &paused})); err != nil {
		t.Fatal(err)
	}
	// The allocator reads the SKU again, now paused, and keeps it.
	if err := deduct("while-paused", 1); reason(err) != string(stock.CodeSKUPaused) {
		t.Fatalf("deduct on a paused SKU = %v, want SKU_PAUSED", err)
	}
	// Resumed behind the allocator's back, as through another allocator.
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `UPDATE skus SET status = 'active' WHERE sku = $1`, sku); err != nil {
		t.Fatal(err)
	}
	if err := deduct("fragmented", 2); err != nil {
		t.Fatalf("deduct 2 (more than any one shard) after the resume = %v (reason %q, code %v), want ok", err, reason(err), connect.CodeOf(err))
	}
	if st := s.stock(sku); st.Sold != 2 || st.Available+st.InTransit != 6 {
		t.Errorf("stock %v, want 2 sold and 6 left", st)
	}
	s.reconcile(sku)
}

// staleRunTimeout bounds sharedStaleSKUCache's calls, retries included.
const staleRunTimeout = time.Minute
