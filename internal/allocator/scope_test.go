package allocator_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestAllocator_KeyScope: an operation is identified by (sku,
// idempotency_key). The same key on two SKUs is two operations, each
// replayed on retry and read back by GetOperation as its own; the same key
// with other parameters on one SKU is IDEMPOTENCY_KEY_REUSED; and a sold-out check
// that looks a key up finds only its SKU's operation, so a request is never
// resent to a shard index because another SKU recorded the key there.
func TestAllocator_KeyScope(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()

	t.Run("TwoSKUs", func(t *testing.T) {
		s.createSKU("scope-x", 2, 10)
		s.createSKU("scope-y", 2, 10)
		reqs := []*stock.Request{deduct("scope-x", "k", 1), deduct("scope-y", "k", 2)}
		for _, replayed := range []bool{false, true} {
			for _, r := range reqs {
				rr := *r
				res := s.alloc.Allocate(ctx, &rr)
				if res.Err != nil || res.Replayed != replayed || res.Operation.SKU != r.Shard.SKU || res.Operation.Quantity != r.Quantity {
					t.Errorf("Allocate(deduct %s k %d) = %+v, want its own operation (replayed %v)", r.Shard.SKU, r.Quantity, res, replayed)
				}
			}
		}
		for _, r := range reqs {
			op, err := s.alloc.GetOperation(ctx, r.Shard.SKU, "k")
			if err != nil || op.SKU != r.Shard.SKU || op.Quantity != r.Quantity {
				t.Errorf("GetOperation(%s, k) = %+v, %v, want the deduct of %d", r.Shard.SKU, op, err, r.Quantity)
			}
		}
		if res := s.alloc.Allocate(ctx, deduct("scope-x", "k", 3)); codeOf(res) != stock.CodeIdempotencyKeyReused {
			t.Errorf("Allocate(deduct scope-x k 3) = %+v, want IDEMPOTENCY_KEY_REUSED", res)
		}
		for sku, want := range map[string]int64{"scope-x": 9, "scope-y": 8} {
			var sum int64
			for _, a := range s.available(sku) {
				sum += a
			}
			if sum != want {
				t.Errorf("%s available = %d, want %d (one deduct)", sku, sum, want)
			}
			s.balanced(sku)
		}
	})

	t.Run("CheckKeepsToItsSKU", func(t *testing.T) {
		// key is recorded on check-x's shard 3.
		s.createSKU("check-x", 4, 4)
		key := keyFor(t, "swept", 4, 3)
		if res := s.alloc.Allocate(ctx, deduct("check-x", key, 1)); res.Err != nil || res.Operation.Shard != 3 {
			t.Fatalf("Allocate(deduct check-x %s 1) = %+v, want shard 3", key, res)
		}
		// check-y sold out through s.alloc, whose hints then say every
		// shard is empty: a new request is answered from the sold-out check.
		s.createSKU("check-y", 4, 4)
		for i := 0; ; i++ {
			if res := s.alloc.Allocate(ctx, deduct("check-y", fmt.Sprint("sell-", i), 1)); res.Err != nil {
				if codeOf(res) != stock.CodeOutOfStock || i != 4 {
					t.Fatalf("Allocate(deduct check-y sell-%d) = %v, want OUT_OF_STOCK after 4", i, res.Err)
				}
				break
			}
		}
		if res := s.alloc.Allocate(ctx, deduct("check-y", key, 1)); codeOf(res) != stock.CodeOutOfStock {
			t.Errorf("Allocate(deduct check-y %s 1) = %+v, want OUT_OF_STOCK (the key is check-x's)", key, res)
		}
		if op, err := s.alloc.GetOperation(ctx, "check-y", key); codeOfErr(err) != stock.CodeOperationNotFound {
			t.Errorf("GetOperation(check-y, %s) = %+v, %v, want OPERATION_NOT_FOUND", key, op, err)
		}
		s.balanced("check-x")
		s.balanced("check-y")
	})
}
