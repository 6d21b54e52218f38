package allocator

import (
	"context"
	"time"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
)

// Store is the storage the allocator reads (and writes SKUs and transfers
// to): internal/postgres implements it (checked where the two are wired
// together, internal/cmd/allocatorcmd). Declared by its consumer, like
// shard.Store: it names only what routing, sweeps and the admin calls need.
type Store interface {
	CreateSKU(ctx context.Context, s stock.SKU, initial int64) error
	GetSKU(ctx context.Context, sku string) (*stock.SKU, error)
	UpdateSKU(ctx context.Context, sku string, u stock.SKUUpdate) (*stock.SKU, error)
	Shards(ctx context.Context, sku string) ([]stock.ShardRow, error)
	ResumeShard(ctx context.Context, k stock.ShardKey) (string, error)
	// Sweep reads a SKU's shards, its stock in transit and its operations
	// of keys (by key; the same key on another SKU is another operation),
	// as of one instant (the check before OUT_OF_STOCK).
	Sweep(ctx context.Context, sku string, keys []string) ([]stock.ShardRow, int64, map[string]*stock.Operation, error)
	GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error)
	CreateTransfer(ctx context.Context, t *stock.Transfer) error
	ListTransfers(ctx context.Context, f stock.TransferFilter, afterID string, limit int) ([]*stock.Transfer, error)
	// StockRead reads a SKU's shards, totals, stock in transit and open
	// transfers in one snapshot.
	StockRead(ctx context.Context, sku string, movingMax int) (*stock.StockRead, error)
	InTransitTotal(ctx context.Context) (int64, error)
	// The rebalancer's: see internal/postgres.
	RaiseMoveFence(ctx context.Context, sku string, token int64, holder string) error
	SetShards(ctx context.Context, sku string, n int32) (*stock.SKU, error)
	FinishRetirement(ctx context.Context, sku string, grace time.Duration) (bool, error)
	RetiringSKUs(ctx context.Context, limit int) ([]string, error)
	ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error)
	Snapshot(ctx context.Context, sku string) (ledger.Snapshot, error)
}
