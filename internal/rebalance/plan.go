// Package rebalance is the rebalancer: it decides and carries out the
// movement of available stock between a SKU's shards. Its policies and
// plans are pure (Decide, Plan and the consolidation's planner return moves
// from a snapshot); a Rebalancer runs them inside an allocator process:
// rounds by demand, automatic split and merge, SetShards and its settling,
// the retirement of shards out of service, and each move as a two-phase,
// ledgered transfer under the SKU's move lease. It reaches the rest of the
// allocator only through what Host hands it.
package rebalance

import (
	"cmp"
	"slices"
)

// Shard is one shard as the planner sees it.
type Shard struct {
	Index     int32
	Available int64
	// Demand is the shard's recent demand (units asked of it); shards
	// with more demand get more stock. All zero: spread evenly.
	Demand int64
	// Retiring shards are out of service: their share is 0, so a plan
	// moves everything they hold to the others and nothing to them.
	Retiring bool
}

// Move is one transfer of available units from one shard to another.
type Move struct {
	From, To int32
	Quantity int64
}

// Options bound a plan.
type Options struct {
	// MovesMax caps the moves of one plan.
	MovesMax int
	// MoveMin is the smallest move worth a transfer.
	MoveMin int64
	// MoveMax caps the units of one move (0: no cap), so that a transfer
	// left half-way strands at most this much in transit.
	MoveMax int64
}

// Plan returns moves that bring each shard's available stock toward its
// share of the total, in proportion to demand (evenly without demand): the
// shards furthest above their share give to those furthest below, largest
// gaps first, at most opts.MovesMax moves of at least opts.MoveMin units.
// The total is unchanged and no shard is asked for more than it holds.
func Plan(shards []Shard, opts Options) []Move {
	targets := shares(shards)
	type gap struct {
		index int32
		delta int64 // > 0: surplus to give; < 0: deficit to fill
	}
	var surplus, deficit []gap
	for i, s := range shards {
		switch d := s.Available - targets[i]; {
		case d > 0:
			surplus = append(surplus, gap{s.Index, d})
		case d < 0:
			deficit = append(deficit, gap{s.Index, -d})
		}
	}
	bySize := func(a, b gap) int {
		if c := cmp.Compare(b.delta, a.delta); c != 0 {
			return c
		}
		return cmp.Compare(a.index, b.index)
	}
	slices.SortFunc(surplus, bySize)
	slices.SortFunc(deficit, bySize)
	var moves []Move
	for i, j := 0, 0; i < len(surplus) && j < len(deficit) && len(moves) < opts.MovesMax; {
		q := min(surplus[i].delta, deficit[j].delta)
		if opts.MoveMax > 0 {
			q = min(q, opts.MoveMax)
		}
		if q >= max(opts.MoveMin, 1) {
			moves = append(moves, Move{From: surplus[i].index, To: deficit[j].index, Quantity: q})
		}
		surplus[i].delta -= q
		deficit[j].delta -= q
		if surplus[i].delta == 0 {
			i++
		}
		if deficit[j].delta == 0 {
			j++
		}
	}
	return moves
}

// shares splits the total available over the shards in service in
// proportion to demand (evenly when there is none); remainders go to the
// first shards. Retiring shards get 0.
func shares(shards []Shard) []int64 {
	var total, demand int64
	var serving []int
	for i, s := range shards {
		total += s.Available
		if !s.Retiring {
			demand += s.Demand
			serving = append(serving, i)
		}
	}
	out := make([]int64, len(shards))
	if len(serving) == 0 {
		return out
	}
	var given int64
	for _, i := range serving {
		if demand > 0 {
			out[i] = int64(float64(total) * float64(shards[i].Demand) / float64(demand))
		} else {
			out[i] = total / int64(len(serving))
		}
		given += out[i]
	}
	for k := 0; given < total; k = (k + 1) % len(serving) {
		out[serving[k]]++
		given++
	}
	return out
}
