package allocator

import (
	"cmp"
	"iter"
	"slices"
)

// hint is what the allocator believes a shard has available: the shard's
// answer to the last request or sweep. Unknown hints are tried.
type hint struct {
	available int64
	known     bool
	// halted: the last sweep found the shard halted. It refuses every
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

// consolidation plans moving stock so that one shard holds q: the target is
// the shard in service (index below serving) with the most available, and
// sources (shards being retired included) give what they have, most first,
// until the target would hold q. Halted shards, and those skip says to
// avoid, take no part: a halted target would refuse the credits and leave
// the units in transit until it is resumed, a halted source refuses the
// debit. It returns nil when the other known shards do not hold q in total.
// It is pure.
func consolidation(hints []hint, serving int32, q int64, skip func(int32) bool) (target int32, moves []move) {
	usable := func(i int32) bool { return !hints[i].halted && (skip == nil || !skip(i)) }
	var order []int32
	for i := range int32(len(hints)) {
		if hints[i].known && hints[i].available > 0 && usable(i) {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(hints[b].available, hints[a].available) })
	target = -1
	for _, i := range order {
		if i < serving {
			target = i
			break
		}
	}
	for i := int32(0); target < 0 && i < min(serving, int32(len(hints))); i++ {
		if usable(i) {
			target = i // every usable shard in service is empty: gather on the first
		}
	}
	if target < 0 {
		return -1, nil
	}
	need := q - max(hints[target].available, 0)
	for _, i := range order {
		if need <= 0 {
			break
		}
		if i == target {
			continue
		}
		take := min(need, hints[i].available)
		moves = append(moves, move{from: i, quantity: take})
		need -= take
	}
	if need > 0 {
		return -1, nil
	}
	return target, moves
}

// move is one transfer of a consolidation.
type move struct {
	from     int32
	quantity int64
}
