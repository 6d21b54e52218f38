package rebalance

import "cmp"

// Policy names a reason to move stock; it labels transfers and metrics.
type Policy string

const (
	// PolicyDrain moves the stock of shards being retired to the others.
	PolicyDrain Policy = "drain"
	// PolicyTail gathers the last units of a SKU near sell-out on one
	// shard, so that every one sells, a request larger than any other
	// shard's stock included.
	PolicyTail Policy = "tail"
	// PolicyRefill moves stock toward the shards with recent demand and
	// away from cold ones, so that routing rarely needs a sold-out check or a
	// consolidation during a sale.
	PolicyRefill Policy = "refill"
	// PolicyConsolidate gathers on one shard the units of a request larger
	// than any one shard holds (the allocator's, per request).
	PolicyConsolidate Policy = "consolidate"
)

// Thresholds of the policies. Each has hysteresis: a policy that has acted
// leaves the SKU where its trigger no longer holds until demand or stock
// change by a margin, so that it does not thrash.
type Thresholds struct {
	// RefillLowWater: refill when a shard in service has less than this
	// fraction of its share of the stock; the plan then brings every shard
	// to its share, four times above the trigger.
	RefillLowWater float64
	// ByDemand weighs the shares by demand (each shard in service's first
	// choices); off, the shares are even. Measured off by default: the
	// allocator's hints already send a request whose first choice is empty
	// straight to a shard with stock, so skewed first choices cost routing
	// nothing, and stock gathered where they point leaves fewer writers
	// working (docs/benchmarks.md, "The rebalancer").
	ByDemand bool
	// DemandFloorDivisor gives every shard in service a floor of demand:
	// the average demand per shard divided by this. Cold shards keep a
	// little stock (a request routed there still sells), hot ones get most.
	DemandFloorDivisor int64
	// TailUnitsPerShard: the tail starts once the SKU's available stock is
	// at most this many units per shard in service. Gathering moves units
	// through transit while they sell, which costs sold-out checks: the default
	// starts it late (the per-request consolidation covers the rest).
	TailUnitsPerShard int64
	// RefillUnitsPerShardMin: no refill below this many available units
	// per shard in service. Near the end of a sale a refill would only put
	// the last units in transit while they sell, which costs each request
	// that needs them a sold-out check and a wait; routing finds them where they
	// are, and the tail policy gathers the very last.
	RefillUnitsPerShardMin int64
	// MoveMinDivisor: a move below total/(shards*MoveMinDivisor) units is
	// not worth a transfer (except in the tail and a drain).
	MoveMinDivisor int64
	// Options bound every plan.
	Options Options
}

// DefaultThresholds are the rebalancer's.
var DefaultThresholds = Thresholds{
	RefillLowWater:         0.25,
	DemandFloorDivisor:     4,
	TailUnitsPerShard:      1,
	RefillUnitsPerShardMin: 32,
	MoveMinDivisor:         16,
	Options:                Options{MovesMax: 16, MoveMin: 1, MoveMax: 1_000_000},
}

// Decide returns what a SKU needs now: the first policy whose trigger holds
// (drain, then tail, then refill) and its moves, or "" and none. force
// skips the refill's trigger (a manual Rebalance, a SetShards).
func Decide(shards []Shard, t Thresholds, force bool) (Policy, []Move) {
	var total, demand int64
	var serving, holding int
	drain := false
	for _, s := range shards {
		total += s.Available
		if s.Available > 0 {
			holding++
		}
		if s.Retiring {
			drain = drain || s.Available > 0
			continue
		}
		serving++
		demand += s.Demand
	}
	if serving == 0 || total == 0 {
		return "", nil
	}
	shares := shards
	if !t.ByDemand {
		demand, shares = 0, withoutDemand(shards)
	}
	weighted := withFloor(shares, demand, serving, t.DemandFloorDivisor)
	if drain {
		return PolicyDrain, Plan(weighted, t.Options)
	}
	if total <= t.TailUnitsPerShard*int64(serving) {
		if holding < 2 {
			return "", nil
		}
		return PolicyTail, tail(shards, t.Options)
	}
	opts := t.Options
	opts.MoveMin = max(opts.MoveMin, total/(int64(serving)*max(t.MoveMinDivisor, 1)))
	if !force && (total < t.RefillUnitsPerShardMin*int64(serving) || !low(weighted, t.RefillLowWater)) {
		return "", nil
	}
	return PolicyRefill, Plan(weighted, opts)
}

// withFloor returns shards with every shard in service's demand raised by
// the floor (a copy).
func withFloor(shards []Shard, demand int64, serving int, divisor int64) []Shard {
	out := make([]Shard, len(shards))
	copy(out, shards)
	if demand == 0 || divisor <= 0 {
		return out
	}
	floor := max(demand/int64(serving)/divisor, 1)
	for i := range out {
		if !out[i].Retiring {
			out[i].Demand += floor
		}
	}
	return out
}

// withoutDemand returns shards with no demand (a copy).
func withoutDemand(shards []Shard) []Shard {
	out := make([]Shard, len(shards))
	for i, s := range shards {
		s.Demand = 0
		out[i] = s
	}
	return out
}

// low reports whether some shard in service holds less than lowWater of
// its share.
func low(shards []Shard, lowWater float64) bool {
	for i, share := range shares(shards) {
		if !shards[i].Retiring && share > 0 && float64(shards[i].Available) < lowWater*float64(share) {
			return true
		}
	}
	return false
}

// tail moves every unit to one shard in service: the one with the most
// demand, then the most stock.
func tail(shards []Shard, opts Options) []Move {
	target := -1
	for i, s := range shards {
		if s.Retiring {
			continue
		}
		if target < 0 || cmp.Or(cmp.Compare(s.Demand, shards[target].Demand), cmp.Compare(s.Available, shards[target].Available)) > 0 {
			target = i
		}
	}
	var moves []Move
	for _, s := range shards {
		if s.Index == shards[target].Index || s.Available == 0 || len(moves) >= opts.MovesMax {
			continue
		}
		moves = append(moves, Move{From: s.Index, To: shards[target].Index, Quantity: s.Available})
	}
	return moves
}
