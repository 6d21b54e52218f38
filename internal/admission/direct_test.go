package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestUntickets: a read that found a SKU never ticketed is trusted for
// stock.DirectTrustMax from its start, and only then; a read that found
// it ticketed ends the trust; after a forget (a direct reserve found no
// unit) no read that began before it is trusted again, even one that
// arrives late or after a ticketed read, while a read that began after it
// is; the map stays bounded.
func TestUntickets(t *testing.T) {
	now := time.Now()
	never := func(at time.Time) stock.EntryCounts { return stock.EntryCounts{ReadAt: at} }
	var u untickets
	if u.trusted("a") {
		t.Fatal("a SKU never read is trusted")
	}
	u.saw("a", never(now))
	if !u.trusted("a") {
		t.Fatal("a fresh read that found the SKU never ticketed is not trusted")
	}
	u.saw("a", stock.EntryCounts{Ticketed: true, ReadAt: now})
	if u.trusted("a") {
		t.Fatal("trusted after a read that found the SKU ticketed")
	}
	u.saw("b", never(now.Add(-stock.DirectTrustMax-time.Millisecond)))
	if u.trusted("b") {
		t.Fatalf("a read that began more than %s ago is trusted", stock.DirectTrustMax)
	}

	// A forget, then a read that began before it (a batch in flight).
	before := time.Now()
	u.saw("c", never(before))
	u.forget("c")
	if u.trusted("c") {
		t.Fatal("trusted right after a forget")
	}
	u.saw("c", never(before))
	if u.trusted("c") {
		t.Fatal("a read that began before the forget is trusted again")
	}
	u.saw("c", stock.EntryCounts{Ticketed: true, ReadAt: before})
	u.saw("c", never(before))
	if u.trusted("c") {
		t.Fatal("a read from before the forget is trusted again after a ticketed read")
	}
	u.saw("c", never(time.Now().Add(time.Millisecond)))
	if !u.trusted("c") {
		t.Fatal("a read that began after the forget is not trusted")
	}

	// Bounded: a full map of fresh reads takes no more SKUs, and trusts
	// none it did not take.
	var full untickets
	for i := range untickSKUsMax + 10 {
		full.saw(fmt.Sprint("sku-", i), never(time.Now()))
	}
	if n := len(full.skus); n > untickSKUsMax {
		t.Fatalf("%d SKUs kept, want at most %d", n, untickSKUsMax)
	}
	if full.trusted(fmt.Sprint("sku-", untickSKUsMax+5)) {
		t.Fatal("a SKU the full map did not take is trusted")
	}
}
