package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// sharedSourceCase (TestE2E_Shared/SourceCase): the source document's case
// through the public API: 100 units on 8 shards over 3 shard servers, 500
// concurrent deducts with 50 duplicate keys.
func sharedSourceCase(t *testing.T, s *stack) {
	const sku = "case"
	s.createSKU(sku, 100, 8)
	sourceCase(t, s, sku)
	s.reconcile(sku)
}

// sourceCase runs the source document's case on sku, which holds 100
// units: 500 concurrent deducts of one unit, 50 of them repeating an
// earlier key. Exactly 100 keys succeed, each once, every repeat replays
// its first answer, and the SKU ends sold out with 100 sold.
func sourceCase(t *testing.T, s *stack, sku string) {
	t.Helper()
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-order-%03d", sku, i)
		if i >= 450 {
			keys[i] = keys[i-450]
		}
	}
	type answer struct {
		resp *v1.DeductResponse
		err  error
	}
	got := make([]answer, len(keys))
	parallel(t, len(keys), 60*time.Second, func(i int) {
		resp, err := s.deduct(context.Background(), sku, keys[i], 1)
		got[i] = answer{resp, err}
	})
	// A first request may itself be answered as a replay: its first try
	// at a shard was in doubt (applied, its answer lost) and the allocator's
	// next try found the key applied. So a key succeeds once when it has
	// at most one answer that is not a replay, whatever its replays.
	firsts, succeeded := map[string]int{}, map[string]bool{}
	oos := 0
	for i, a := range got {
		if a.err == nil {
			succeeded[keys[i]] = true
		}
		switch {
		case a.err == nil && !a.resp.Replayed:
			firsts[keys[i]]++
		case a.err == nil:
		case a.err != nil && reason(a.err) == "OUT_OF_STOCK":
			oos++
		case a.err != nil:
			t.Errorf("Deduct(%s) = %v, want success or OUT_OF_STOCK", keys[i], a.err)
		}
	}
	if len(succeeded) != 100 {
		t.Errorf("%s: distinct keys that succeeded = %d, want 100", sku, len(succeeded))
	}
	for k, n := range firsts {
		if n != 1 {
			t.Errorf("key %s succeeded %d times without replay", k, n)
		}
	}
	for i := 450; i < 500; i++ {
		a, b := got[i-450], got[i]
		if (a.err == nil) != (b.err == nil) {
			t.Errorf("key %s: %v / %v disagree", keys[i], a.err, b.err)
			continue
		}
		if a.err == nil && !a.resp.Replayed && !b.resp.Replayed {
			t.Errorf("key %s: neither answer is a replay, want at least one", keys[i])
		}
		if a.err == nil && a.resp.Operation.Shard != b.resp.Operation.Shard {
			t.Errorf("key %s: the replay names shard %d, the original %d", keys[i], b.resp.Operation.Shard, a.resp.Operation.Shard)
		}
	}
	st := s.stock(sku)
	if st.Available != 0 || st.Sold != 100 {
		t.Errorf("%s: stock = %v, want available 0, sold 100", sku, st)
	}
}

// sharedNoFalseSoldOut (TestE2E_Shared/NoFalseSoldOut): stock spread thin
// over many shards still sells to the last unit, and a request larger than
// any one shard succeeds.
func sharedNoFalseSoldOut(t *testing.T, s *stack) {
	ctx := context.Background()
	t.Run("LastUnits", func(t *testing.T) {
		s.createSKU("thin", 10, 8) // shards of 2, 2, 1, 1, 1, 1, 1, 1
		for i := 0; i < 10; i++ {
			if _, err := s.deduct(ctx, "thin", fmt.Sprintf("thin-%d", i), 1); err != nil {
				t.Fatalf("Deduct #%d = %v, want success", i+1, err)
			}
		}
		if _, err := s.deduct(ctx, "thin", "thin-10", 1); reason(err) != "OUT_OF_STOCK" {
			t.Errorf("Deduct #11 = %v, want OUT_OF_STOCK", err)
		}
		// After the sell-out a retry still gets its first result.
		for i := 0; i < 10; i++ {
			resp, err := s.deduct(ctx, "thin", fmt.Sprintf("thin-%d", i), 1)
			if err != nil || !resp.Replayed {
				t.Errorf("retry of Deduct #%d after the sell-out = %v, %v, want a replay", i+1, resp, err)
			}
		}
		if _, err := s.deduct(ctx, "thin", "thin-0", 2); reason(err) != "IDEMPOTENCY_KEY_REUSED" {
			t.Errorf("reuse of a key after the sell-out = %v, want IDEMPOTENCY_KEY_REUSED", err)
		}
		s.reconcile("thin")
	})
	t.Run("LargerThanAnyShard", func(t *testing.T) {
		s.createSKU("split", 3, 3) // 1 unit on each of 3 shards
		resp, err := s.deduct(ctx, "split", "split-1", 3)
		if err != nil {
			t.Fatalf("Deduct(3) = %v, want success", err)
		}
		if resp.Replayed {
			t.Errorf("Deduct(3) replayed = true, want a first success")
		}
		if st := s.stock("split"); st.Available != 0 || st.Sold != 3 || st.InTransit != 0 {
			t.Errorf("stock = %v, want available 0, sold 3, nothing in transit", st)
		}
		s.reconcile("split")
	})
}
