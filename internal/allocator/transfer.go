package allocator

import (
	"context"
	"fmt"

	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
)

// consolidate moves stock so that one shard in service holds q units: a
// request larger than any one shard but not than the SKU must not be
// refused. It goes through the same rule as the rebalancer: it takes the
// SKU's move lease (waiting, within the request's deadline, while another
// mover has it) and its transfers carry the lease's token. Each move is a
// two-phase, ledgered transfer; one that fails half-way is finished by the
// shard servers' sweep, and the stock counts as in transit meanwhile.
func (a *Allocator) consolidate(ctx context.Context, sku *stock.SKU, q int64) error {
	h, err := a.holdSKU(ctx, sku.Name, true)
	if err != nil {
		return err
	}
	defer h.release()
	target, moves := consolidation(a.hintsOf(sku.Name, max(sku.ShardSpan, sku.Shards)), sku.Shards, q, a.skipper(sku.Name))
	if moves == nil {
		return fmt.Errorf("allocator: the reachable shards do not hold %d", q)
	}
	ms := make([]rebalance.Move, len(moves))
	for i, m := range moves {
		ms[i] = rebalance.Move{From: m.from, To: target, Quantity: m.quantity}
	}
	a.metrics.consolidations.Inc()
	for _, t := range a.runMoves(ctx, h, ms, rebalance.PolicyConsolidate, stock.SourceAllocator) {
		if t.State != stock.TransferCredited {
			return fmt.Errorf("allocator: transfer %s from shard %d ended %s", t.ID, t.From, t.State)
		}
	}
	return nil
}
