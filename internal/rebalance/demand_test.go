package rebalance

import (
	"fmt"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestDemandBook_Round: a round counts the units asked of every shard,
// the highest index too, decays them, and ranks SKUs by their demand.
func TestDemandBook_Round(t *testing.T) {
	var b demandBook
	b.add("low", 0, 1)
	b.add("high", stock.ShardsMax-1, 5)
	b.add("high", 3, 2)
	got := b.round(2)
	if len(got) != 2 || got[0].sku != "high" || got[1].sku != "low" {
		t.Fatalf("round(2) = %v, want high then low", got)
	}
	if r := got[0].recent; r[stock.ShardsMax-1] != 5 || r[3] != 2 || got[0].rate != 7 {
		t.Errorf("high: recent[%d] %d, recent[3] %d, rate %d; want 5, 2, 7", stock.ShardsMax-1, r[stock.ShardsMax-1], r[3], got[0].rate)
	}
	b.add("high", stock.ShardsMax-1, 1)
	got = b.round(1)
	if r := got[0].recent[stock.ShardsMax-1]; r != 5/2+1 || got[0].rate != 1 {
		t.Errorf("after a second round: recent %d, rate %d; want %d, 1", r, got[0].rate, 5/2+1)
	}
}

// BenchmarkDemandBook_Round: a round over 1,000 SKUs of 8 shards, each
// asked of since the last round (model C's cold SKUs).
func BenchmarkDemandBook_Round(b *testing.B) {
	var book demandBook
	for b.Loop() {
		b.StopTimer()
		for i := range 1000 {
			book.add(fmt.Sprintf("sku-%d", i), int32(i%8), 1)
		}
		b.StartTimer()
		book.round(leasesHeldMax)
	}
}
