package shard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// One shard server over two databases: each SKU's writes go to its own
// database, and the sweeper expires the holds of both, every pass.
func TestServer_TwoDatabases(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	dbA, _ := openDB(t)
	dbB, _ := openDB(t)
	locate := func(_ context.Context, sku string) (string, error) {
		if strings.HasPrefix(sku, "a-") {
			return "a", nil
		}
		return "b", nil
	}
	s := newServerWith(t, shard.Config{ServerID: "two", DBs: map[string]shard.Store{"a": dbA, "b": dbB}, Locate: locate, Logger: testLogger()})
	ctx := context.Background()
	stores := map[string]*postgres.DB{"a-sku": dbA, "b-sku": dbB}
	for sku, db := range stores {
		if err := db.CreateSKU(ctx, stock.SKU{Name: sku, Status: stock.StatusActive, Shards: 1, ShardSpan: 1, ReservationTTL: time.Minute}, 10); err != nil {
			t.Fatal(err)
		}
		acquire(t, s, sku, 1, 0)
	}
	for sku := range stores {
		if res := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku}, Quantity: 2, Key: sku + "-d"}); res.Err != nil {
			t.Fatalf("Deduct(%s) = %v", sku, res.Err)
		}
		if res := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: sku}, Quantity: 3, Key: sku + "-r", TTL: time.Second}); res.Err != nil {
			t.Fatalf("Reserve(%s) = %v", sku, res.Err)
		}
	}
	// Each SKU's row lives in its own database only.
	if _, err := dbA.LoadShard(ctx, stock.ShardKey{SKU: "b-sku"}); stock.CodeOf(err) != stock.CodeSKUNotFound {
		t.Errorf("b-sku's shard in database a: %v, want SKU_NOT_FOUND", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for sku, db := range stores {
		for {
			c, err := db.LoadShard(ctx, stock.ShardKey{SKU: sku})
			if err != nil {
				t.Fatal(err)
			}
			if c == (stock.Counts{Available: 8, Sold: 2}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s in its database: %+v 10 s after its hold's expiry, want available 8, sold 2", sku, c)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
