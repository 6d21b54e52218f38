package rebalance

import (
	"context"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Store is the storage the rebalancer reads and writes: internal/postgres
// implements it (through internal/dbset when SKUs are placed on several
// databases; checked in dbset's tests). Declared by its consumer: it names
// only what the rebalancer calls.
type Store interface {
	GetSKU(ctx context.Context, sku string) (*stock.SKU, error)
	// Shards reads a SKU's shards as committed: what a plan decides from.
	Shards(ctx context.Context, sku string) ([]stock.ShardRow, error)
	// SetShards changes the number of a SKU's shards in service.
	SetShards(ctx context.Context, sku string, n int32) (*stock.SKU, error)
	// RaiseMoveFence raises a SKU's move fence to a lease's token, so that
	// no older holder's transfer starts from then on.
	RaiseMoveFence(ctx context.Context, sku string, token int64, holder string) error
	CreateTransfer(ctx context.Context, t *stock.Transfer) error
	// RetiringSKUs lists SKUs with shards being retired; FinishRetirement
	// retires a SKU's shards once they hold nothing and grace has passed
	// since its last layout change.
	RetiringSKUs(ctx context.Context, limit int) ([]string, error)
	FinishRetirement(ctx context.Context, sku string, grace time.Duration) (bool, error)
}
