package rebalance

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/shardstock/shardstock/internal/stock"
)

// Hint is what routing believes a shard has available: the shard's answer
// to the last request or sold-out check.
type Hint struct {
	Available int64
	Known     bool
	// Halted: the last sold-out check found the shard halted. It refuses every
	// write until an operator resumes it, a transfer's credit included, so
	// it is never part of a consolidation.
	Halted bool
}

// Consolidate moves stock so that one shard in service holds q units: a
// request larger than any one shard but not than the SKU must not be
// refused. It goes through the same rule as the rounds: it takes the
// SKU's move lease (waiting, within the request's deadline, while another
// mover has it) and its transfers carry the lease's token. hints returns
// the shards' hints (by index, those being retired included) as routing
// sees them once the lease is held; skip says which shards to avoid (their
// server unknown or failing). Each move is a two-phase, ledgered transfer;
// one that fails half-way is finished by the shard servers' sweep, and the
// stock counts as in transit meanwhile.
func (r *Rebalancer) Consolidate(ctx context.Context, sku *stock.SKU, q int64, hints func() []Hint, skip func(int32) bool) error {
	h, err := r.hold(ctx, sku.Name, true)
	if err != nil {
		return err
	}
	defer h.release()
	target, moves := consolidation(hints(), sku.Shards, q, skip)
	if moves == nil {
		return fmt.Errorf("rebalance: the reachable shards do not hold %d", q)
	}
	ms := make([]Move, len(moves))
	for i, m := range moves {
		ms[i] = Move{From: m.from, To: target, Quantity: m.quantity}
	}
	r.metrics.consolidations.Inc()
	for _, t := range r.runMoves(ctx, h, ms, PolicyConsolidate, stock.SourceAllocator) {
		if t.State != stock.TransferCredited {
			return fmt.Errorf("rebalance: transfer %s from shard %d ended %s", t.ID, t.From, t.State)
		}
	}
	return nil
}

// consolidation plans moving stock so that one shard holds q: the target is
// the shard in service (index below serving) with the most available, and
// sources (shards being retired included) give what they have, most first,
// until the target would hold q. Halted shards, and those skip says to
// avoid, take no part: a halted target would refuse the credits and leave
// the units in transit until it is resumed, a halted source refuses the
// debit. It returns nil when the other known shards do not hold q in total.
// It is pure.
func consolidation(hints []Hint, serving int32, q int64, skip func(int32) bool) (target int32, moves []move) {
	usable := func(i int32) bool { return !hints[i].Halted && (skip == nil || !skip(i)) }
	var order []int32
	for i := range int32(len(hints)) {
		if hints[i].Known && hints[i].Available > 0 && usable(i) {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(hints[b].Available, hints[a].Available) })
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
	need := q - max(hints[target].Available, 0)
	for _, i := range order {
		if need <= 0 {
			break
		}
		if i == target {
			continue
		}
		take := min(need, hints[i].Available)
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
