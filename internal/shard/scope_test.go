package shard_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestShard_KeyScope: an operation is identified by (sku, idempotency_key),
// whatever database each SKU lives in. The same key on two SKUs makes two
// operations, each with its own result, each a replay of itself on retry,
// also when both retries share one group transaction; on one SKU the key
// with other parameters is still IDEMPOTENCY_KEY_REUSED.
func TestShard_KeyScope(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	ctx := context.Background()
	dbA, _ := openDB(t)
	dbB, _ := openDB(t)
	// scope-a-* live in database a, scope-b-* in database b.
	locate := func(_ context.Context, sku string) (string, error) {
		if strings.HasPrefix(sku, "scope-a-") {
			return "a", nil
		}
		return "b", nil
	}
	s := newServerWith(t, shard.Config{ServerID: "scope", DBs: map[string]shard.Store{"a": dbA, "b": dbB}, Locate: locate, Logger: testLogger()})
	stores := map[string]*postgres.DB{"scope-a-1": dbA, "scope-a-2": dbA, "scope-b-1": dbB}
	for sku, db := range stores {
		createSKU(t, db, stock.SKU{Name: sku, Shards: 2}, 100)
		acquire(t, s, sku, 1, 0, 1)
	}
	req := func(kind stock.OpKind, sku string, idx int32, q int64, key string) *stock.Request {
		return &stock.Request{Kind: kind, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: q, Key: key}
	}
	// check fails unless res is r's own operation, replayed or not.
	check := func(t *testing.T, r *stock.Request, res stock.Result, replayed bool) {
		t.Helper()
		if res.Err != nil || res.Replayed != replayed || res.Operation == nil || res.Operation.SKU != r.Shard.SKU ||
			res.Operation.Kind != r.Kind || res.Operation.Quantity != r.Quantity {
			t.Errorf("Do(%s %s %d %s) = %+v, want its own operation (replayed %v)", r.Kind, r.Shard.SKU, r.Quantity, r.Key, res, replayed)
		}
	}

	for _, tc := range []struct {
		name string
		skus []string
	}{
		{"SameDatabase", []string{"scope-a-1", "scope-a-2"}},
		{"TwoDatabases", []string{"scope-a-1", "scope-b-1", "scope-a-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			// Deducts and reserves of different quantities: results that
			// tell one SKU's from another's.
			reqs := func() []*stock.Request {
				var rs []*stock.Request
				for i, sku := range tc.skus {
					rs = append(rs, req([]stock.OpKind{stock.OpDeduct, stock.OpReserve}[i%2], sku, 0, int64(i+2), key))
				}
				return rs
			}
			first := reqs()
			want := map[string]stock.Counts{}
			for _, r := range first {
				want[r.Shard.SKU] = total(t, stores[r.Shard.SKU], r.Shard.SKU).Add(r.Kind.Delta(r.Quantity))
			}
			for _, r := range first {
				check(t, r, s.Do(ctx, r), false)
			}
			// Retried on the other shard, one at a time, then all at once
			// (one group per database): each replays its own first result.
			for _, r := range first {
				again := *r
				again.Shard.Index = 1
				res := s.Do(ctx, &again)
				check(t, r, res, true)
				if res.Err == nil && res.Operation.Shard != 0 {
					t.Errorf("Do(%s %s) on shard 1 = shard %d, want a replay of shard 0's", r.Kind, r.Shard.SKU, res.Operation.Shard)
				}
			}
			for i, res := range s.DoAll(ctx, reqs()) {
				check(t, first[i], res, true)
			}
			// Other parameters on the same (sku, key): refused.
			if res := s.Do(ctx, req(stock.OpDeduct, tc.skus[0], 0, 5, key)); res.Err == nil || res.Err.Code != stock.CodeIdempotencyKeyReused {
				t.Errorf("Do(deduct %s 5 %s) = %+v, want IDEMPOTENCY_KEY_REUSED", tc.skus[0], key, res)
			}
			for sku, w := range want {
				if got := total(t, stores[sku], sku); got != w {
					t.Errorf("%s = %+v, want %+v (one operation each)", sku, got, w)
				}
				reconcile(t, stores[sku], sku)
			}
		})
	}
}
