package allocator_test

import (
	"context"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestAllocator_ResumedElsewhere: a SKU paused and resumed through another
// allocator sells through this one, which never saw it paused, even where a
// shard's writer last read it paused. Asked more than that shard holds, the
// writer refuses without a transaction; it must refuse for stock (this
// allocator moves on, then consolidates), not SKU_PAUSED from its copy of
// the SKU (final: the buyer is told no while the SKU sells).
func TestAllocator_ResumedElsewhere(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()
	const sku = "resumed-elsewhere"
	s.createSKU(sku, 2, 2) // one unit on each shard
	other := s.newAllocator()
	update := func(paused bool) {
		t.Helper()
		if _, err := other.UpdateSKU(ctx, sku, stock.SKUUpdate{Paused: &paused}); err != nil {
			t.Fatalf("UpdateSKU(%s, paused %v) = %v", sku, paused, err)
		}
	}
	update(true)
	// Shard 1's writer reads the SKU paused, with the row (one unit).
	if res := other.Allocate(ctx, deduct(sku, keyFor(t, "while-paused", 2, 1), 1)); codeOf(res) != stock.CodeSKUPaused || res.Available != 1 {
		t.Fatalf("Allocate(deduct 1) through the allocator that paused it = %+v, want SKU_PAUSED from shard 1", res)
	}
	update(false)
	// Shard 0 first (it has 1 of 2), then shard 1, whose writer holds the
	// SKU as it was before the resume.
	res := s.alloc.Allocate(ctx, deduct(sku, keyFor(t, "after", 2, 0), 2))
	if res.Err != nil {
		t.Fatalf("Allocate(deduct 2) after the resume = %v, want success (consolidated)", res.Err)
	}
	if got := s.available(sku); got[0]+got[1] != 0 {
		t.Errorf("available after deducting both units = %v, want none", got)
	}
	s.balanced(sku)
}
