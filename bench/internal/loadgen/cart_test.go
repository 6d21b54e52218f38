package loadgen_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/loadgentest"
)

// TestRunner_Cart drives the cart model through the runner on the
// in-memory system: an honest one passes, with carts bought and refunded;
// one that leaves an order half held, or refunds beyond a sale, fails the
// correctness line; a target without orders is refused.
func TestRunner_Cart(t *testing.T) {
	// 20 SKUs of ample stock (a million units each), 400 carts.
	cfg := loadgen.Config{Model: loadgen.ModelCart, SKUs: 20, Concurrency: 8, Requests: 400}

	t.Run("Clean", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{}, cfg)
		checkCounts(t, res)
		k := res.Cart
		if k == nil || k.Orders != 400 || k.Committed == 0 || k.Lines < 2*k.Committed || k.Refunds == 0 {
			t.Fatalf("Cart = %+v, want 400 orders, some bought (2 to 5 lines each) and refunded", k)
		}
		if c := res.Correctness; !c.Clean() || c.Unresolved != 0 {
			t.Errorf("Correctness = %+v, want all zero", c)
		}
	})
	t.Run("Refused", func(t *testing.T) {
		// Stock for about 60 lines: most carts are refused whole, and
		// each refused one must have released the lines it had held.
		c := cfg
		c.Stock = 3
		res := run(t, &loadgentest.Memory{}, c)
		if res.Cart.Refused == 0 || res.Cart.Committed == 0 {
			t.Fatalf("Cart = %+v, want carts refused and carts bought", res.Cart)
		}
		if !res.Correctness.Clean() {
			t.Errorf("Correctness = %+v, want all zero", res.Correctness)
		}
	})
	t.Run("HalfHeld", func(t *testing.T) {
		// Every 10th commit leaves its last line held: an order half held.
		res := run(t, &loadgentest.Memory{HalfCommitEvery: 10}, cfg)
		c := res.Correctness
		if c.HalfHeld == 0 || c.Clean() || res.Verdict() != "FAIL" {
			t.Fatalf("HalfHeld = %d, Clean = %v, verdict %s, want orders half held and a failed run", c.HalfHeld, c.Clean(), res.Verdict())
		}
		if want := res.Cart.Committed / 10; c.HalfHeld != want {
			t.Errorf("HalfHeld = %d, want %d (every 10th of %d commits)", c.HalfHeld, want, res.Cart.Committed)
		}
		if !detailHas(c.Details, "half held") {
			t.Errorf("Details = %q, want a line naming an order half held", c.Details)
		}
	})
	t.Run("RefundBeyondSale", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{RefundTwice: true}, cfg)
		c := res.Correctness
		if c.RefundBeyondSale == 0 || c.Clean() {
			t.Fatalf("RefundBeyondSale = %d, Clean = %v, want units refunded beyond their sale", c.RefundBeyondSale, c.Clean())
		}
	})
	t.Run("NotSupported", func(t *testing.T) {
		r, err := loadgen.NewRunner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The Target alone, without the orders of OrderTarget.
		_, err = r.Run(context.Background(), struct{ loadgen.Target }{&loadgentest.Memory{}})
		if err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("Run(a target without orders) = %v, want not supported", err)
		}
	})
}

func detailHas(details []string, s string) bool {
	for _, d := range details {
		if strings.Contains(d, s) {
			return true
		}
	}
	return false
}
