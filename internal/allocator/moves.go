package allocator

import (
	"context"

	"github.com/shardstock/shardstock/internal/stock"
)

// The admin calls that move stock: each is a call into the rebalancer
// (internal/rebalance), which decides and runs the moves.

// Rebalance runs one plan for a SKU now (rebalance.Rebalancer.Rebalance).
func (a *Allocator) Rebalance(ctx context.Context, sku string, dryRun bool) ([]*stock.Transfer, error) {
	return a.rebal.Rebalance(ctx, sku, dryRun)
}

// SetShards changes the number of a SKU's shards in service, online
// (rebalance.Rebalancer.SetShards), and returns the SKU's stock once the
// new layout is in force for routing.
func (a *Allocator) SetShards(ctx context.Context, name string, shards int32) (*stock.Stock, error) {
	if err := a.rebal.SetShards(ctx, name, shards); err != nil {
		return nil, err
	}
	return a.GetStock(ctx, name)
}

// MoveLeases lists the move leases held now, by SKU.
func (a *Allocator) MoveLeases(ctx context.Context) ([]stock.MoveLease, error) {
	return a.rebal.MoveLeases(ctx)
}
