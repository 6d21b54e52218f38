package allocator

import (
	"cmp"
	"context"
	"iter"
	"slices"

	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
)

// hint is what the allocator believes a shard has available: the shard's
// answer to the last request or sold-out check. Unknown hints are tried.
type hint struct {
	available int64
	known     bool
	// halted: the last sold-out check found the shard halted. It refuses every
	// write until an operator resumes it, a transfer's credit included, so
	// it is never part of a consolidation. A shard that answers a request
	// is not halted: its answer clears this.
	halted bool
}

// candidates orders the shards to try for a request of quantity q: first the
// key's stable first choice, then the others that may have enough, by most
// available first (unknown ones before known ones, to learn them), ties
// broken by distance from the first choice so that load spreads. Shards that
// skip says to avoid, or known to have less than q, are left out. Apart
// from skip (which looks a shard's server up, and may make its client) it
// is pure. The others are looked at only once the first choice is passed,
// so skip answers for them as it stands then: most requests end at the
// first choice.
func candidates(n int32, first int32, hints []hint, q int64, skip func(int32) bool) iter.Seq[int32] {
	return func(yield func(int32) bool) {
		fits := func(i int32) bool {
			// The hint first: skip looks the shard's server up, and a
			// sold-out SKU's shards are all known to lack q.
			return (!hints[i].known || hints[i].available >= q) && (skip == nil || !skip(i))
		}
		if fits(first) && !yield(first) {
			return
		}
		rest := make([]int32, 0, n)
		for d := int32(1); d < n; d++ {
			if i := (first + d) % n; fits(i) {
				rest = append(rest, i)
			}
		}
		rank := func(i int32) int64 {
			if !hints[i].known {
				return 1 << 62
			}
			return hints[i].available
		}
		slices.SortStableFunc(rest, func(a, b int32) int { return cmp.Compare(rank(b), rank(a)) })
		for _, i := range rest {
			if !yield(i) {
				return
			}
		}
	}
}

// consolidate has the rebalancer gather q units of sku on one shard in
// service, planned from this allocator's hints as they stand once it holds
// the SKU's move lease.
func (a *Allocator) consolidate(ctx context.Context, sku *stock.SKU, q int64) error {
	hints := func() []rebalance.Hint {
		hs := a.hintsOf(sku.Name, max(sku.ShardSpan, sku.Shards))
		out := make([]rebalance.Hint, len(hs))
		for i, h := range hs {
			out[i] = rebalance.Hint{Available: h.available, Known: h.known, Halted: h.halted}
		}
		return out
	}
	return a.rebal.Consolidate(ctx, sku, q, hints, a.skipper(sku.Name))
}
