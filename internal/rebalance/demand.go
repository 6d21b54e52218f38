package rebalance

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shardstock/shardstock/internal/stock"
)

// demandSKUsMax bounds the SKUs whose demand one allocator tracks (2 KB
// each: 8 MB at most). A SKU past the bound is not tracked until a round
// forgets an idle one; the rebalancer then does not refill it, and routing
// still checks and consolidates for it.
const demandSKUsMax = 4096

// demandIdleRounds is how many rounds without a request a SKU stays
// tracked.
const demandIdleRounds = 60

// demandBook counts, per SKU, the units asked of each shard as first
// choice (the key's hash: where the request would go with stock
// everywhere), which is the demand the refill policy moves stock toward.
// The hot path is a read lock and an atomic add.
type demandBook struct {
	mu   sync.RWMutex
	skus map[string]*skuDemand
}

type skuDemand struct {
	window [stock.ShardsMax]atomic.Int64 // units since the last round
	// used is one past the highest shard ever asked of: a round folds
	// only the shards below it (8 of the 256 for a SKU of 8 shards); the
	// rest hold nothing. A round holds the book's lock, which every
	// request's add waits for, while it folds every SKU.
	used   atomic.Int32
	recent [stock.ShardsMax]int64 // decayed: half the last value plus the window; under demandBook.mu
	idle   int                    // rounds without demand; under demandBook.mu
	hot    int                    // rounds in a row above the split rate; under Rebalancer.mu
}

// add counts q units asked of shard first of sku.
func (b *demandBook) add(sku string, first int32, q int64) {
	if q <= 0 || first < 0 || first >= stock.ShardsMax {
		return
	}
	b.mu.RLock()
	d := b.skus[sku]
	b.mu.RUnlock()
	if d == nil {
		b.mu.Lock()
		if b.skus == nil {
			b.skus = map[string]*skuDemand{}
		}
		if d = b.skus[sku]; d == nil && len(b.skus) < demandSKUsMax {
			d = &skuDemand{}
			b.skus[sku] = d
		}
		b.mu.Unlock()
		if d == nil {
			return
		}
	}
	// Raised before the add: a round that sees the add sees the shard.
	for u := d.used.Load(); first >= u && !d.used.CompareAndSwap(u, first+1); u = d.used.Load() {
	}
	d.window[first].Add(q)
}

// recentOf returns a SKU's decayed demand by shard, or nil if it is not
// tracked.
func (b *demandBook) recentOf(sku string) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := b.skus[sku]; d != nil {
		return slices.Clone(d.recent[:])
	}
	return nil
}

// skuRound is one SKU's demand as a round sees it.
type skuRound struct {
	sku    string
	recent []int64 // by shard
	total  int64   // sum of recent
	rate   int64   // units in the last round, all shards
	d      *skuDemand
}

// round folds every SKU's window into its decayed demand, forgets SKUs idle
// for demandIdleRounds, and returns up to limit SKUs with recent demand,
// most first.
func (b *demandBook) round(limit int) []skuRound {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []skuRound
	for name, d := range b.skus {
		var rate, total int64
		for i := range d.used.Load() {
			w := d.window[i].Swap(0)
			rate += w
			d.recent[i] = d.recent[i]/2 + w
			total += d.recent[i]
		}
		if rate == 0 {
			d.idle++
		} else {
			d.idle = 0
		}
		if d.idle >= demandIdleRounds {
			delete(b.skus, name)
			continue
		}
		if total > 0 {
			out = append(out, skuRound{sku: name, recent: d.recent[:], total: total, rate: rate, d: d})
		}
	}
	slices.SortFunc(out, func(x, y skuRound) int { return cmp.Compare(y.total, x.total) })
	if len(out) > limit {
		out = out[:limit]
	}
	for i := range out {
		out[i].recent = slices.Clone(out[i].recent)
	}
	return out
}
