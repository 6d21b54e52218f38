package allocator_test

import (
	"context"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestAllocator_HaltedShard: a halted shard is neither the target nor a
// source of a consolidation, even when it holds the most. A request larger
// than any one shard is served from the shards in service, or refused as
// retryable when only the halted shard's stock would make it fit; no unit is
// left in transit waiting for the halted shard to be resumed.
func TestAllocator_HaltedShard(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()
	// setup makes a SKU of 4 shards holding 40, 10, 10 and 10, and halts
	// shard 0, the largest.
	setup := func(t *testing.T, sku string) {
		t.Helper()
		s.createSKU(sku, 4, 40)
		k := keyFor(t, sku+"-restock", 4, 0)
		res := s.alloc.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: sku}, Quantity: 30, Key: k})
		if res.Err != nil || res.Operation.Shard != 0 {
			t.Fatalf("AdjustStock(replenish %s 30) = %+v, want success on shard 0", k, res)
		}
		halt(t, s.url, sku, 0, "ledger mismatch")
	}
	// untouched fails the test if shard 0 holds other than 40, if a transfer
	// touched it, or if any unit is in transit.
	untouched := func(t *testing.T, sku string) {
		t.Helper()
		if got := s.available(sku)[0]; got != 40 {
			t.Errorf("available on halted shard 0 = %d, want 40", got)
		}
		ts, err := s.alloc.ListTransfers(ctx, stock.TransferFilter{SKU: sku}, "", 100)
		if err != nil {
			t.Fatalf("ListTransfers(%s) = %v", sku, err)
		}
		for _, tr := range ts {
			if tr.To == 0 || tr.From == 0 {
				t.Errorf("transfer %s from %d to %d of %d is %s, want none to or from halted shard 0", tr.ID, tr.From, tr.To, tr.Quantity, tr.State)
			}
		}
		st, err := s.alloc.GetStock(ctx, sku)
		if err != nil {
			t.Fatalf("GetStock(%s) = %v", sku, err)
		}
		if st.InTransit != 0 {
			t.Errorf("GetStock(%s).InTransit = %d, want 0 (nothing stranded)", sku, st.InTransit)
		}
		s.balanced(sku)
	}

	t.Run("ServedByShardsInService", func(t *testing.T) {
		const sku = "halted-serve"
		setup(t, sku)
		// 25 is more than any shard in service holds but not than the
		// three hold together.
		res := s.alloc.Allocate(ctx, deduct(sku, "big-25", 25))
		if res.Err != nil || res.Operation.Shard == 0 {
			t.Errorf("Allocate(deduct 25) = %+v, want success on a shard in service (1 to 3 hold 30)", res)
		}
		var rest int64
		for _, a := range s.available(sku)[1:] {
			rest += a
		}
		if rest != 5 {
			t.Errorf("available on shards 1 to 3 after deducting 25 of 30 = %d, want 5", rest)
		}
		untouched(t, sku)
	})
	t.Run("MoreThanShardsInServiceHold", func(t *testing.T) {
		const sku = "halted-short"
		setup(t, sku)
		// 45 fits only with the halted shard's stock: not a sold-out (the
		// stock is there), and nothing to gather it on.
		res := s.alloc.Allocate(ctx, deduct(sku, "big-45", 45))
		if codeOf(res) != stock.CodeShardUnavailable {
			t.Errorf("Allocate(deduct 45) = %+v, want SHARD_UNAVAILABLE (shards 1 to 3 hold 30, halted shard 0 holds 40)", res)
		}
		if got := s.available(sku)[1:]; got[0]+got[1]+got[2] != 30 {
			t.Errorf("available on shards 1 to 3 = %v, want 30 in all", got)
		}
		untouched(t, sku)
	})
	// The rebalancer's policies (rebalance.Rebalancer.decide) leave a halted
	// shard out too: an empty halted shard is not refilled.
	t.Run("NotARebalanceTarget", func(t *testing.T) {
		const sku = "halted-refill"
		s.createSKU(sku, 4, 40) // 10 on each
		for _, idx := range []int32{0, 3} {
			if res := s.alloc.Allocate(ctx, deduct(sku, keyFor(t, "empty", 4, idx), 10)); res.Err != nil || res.Operation.Shard != idx {
				t.Fatalf("Allocate(deduct 10 from shard %d) = %+v", idx, res)
			}
		}
		halt(t, s.url, sku, 0, "ledger mismatch")
		ts, err := s.alloc.Rebalance(ctx, sku, false)
		if err != nil {
			t.Fatalf("Rebalance(%s) = %v", sku, err)
		}
		to3 := false
		for _, tr := range ts {
			to3 = to3 || (tr.To == 3 && tr.State == stock.TransferCredited)
			if tr.To == 0 || tr.From == 0 {
				t.Errorf("Rebalance(%s) moved %d from %d to %d, want nothing to or from halted shard 0", sku, tr.Quantity, tr.From, tr.To)
			}
		}
		if !to3 {
			t.Errorf("Rebalance(%s) = %+v, want a refill of empty shard 3 (in service, not halted)", sku, ts)
		}
		if got := s.available(sku)[0]; got != 0 {
			t.Errorf("available on halted shard 0 = %d, want 0", got)
		}
		s.balanced(sku)
	})
}
