package allocator

import (
	"context"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
)

// Store is all the storage an allocator is given: what its routing, its
// admin calls and its rebalancer each read and write. internal/postgres
// implements it, through internal/dbset when SKUs are placed on several
// databases (each part checked in dbset's tests; the whole where the two
// are wired together, internal/cmd/allocatorcmd).
type Store interface {
	RouteStore
	AdminStore
	rebalance.Store
}

// RouteStore is the storage routing reads: a SKU's configuration, and the
// sold-out check before OUT_OF_STOCK. Declared by its consumer, like shard.Store.
type RouteStore interface {
	GetSKU(ctx context.Context, sku string) (*stock.SKU, error)
	// SoldOutCheck reads a SKU's shards, its stock in transit and its operations
	// of keys (by key; the same key on another SKU is another operation),
	// as of one instant (the check before OUT_OF_STOCK).
	SoldOutCheck(ctx context.Context, sku string, keys []string) ([]stock.ShardRow, int64, map[string]*stock.Operation, error)
	GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error)
	// LookupOperations reads a SKU's operations of keys, by key, in one
	// round trip.
	LookupOperations(ctx context.Context, sku string, keys []string) (map[string]*stock.Operation, error)
	// OperationKeys calls each with the keys of a SKU's operations, at
	// most limit, and returns how many it found, up to limit+1.
	OperationKeys(ctx context.Context, sku string, limit int, each func(key string)) (int, error)
}

// AdminStore is the storage the admin calls read and write, and the
// in-transit gauge reads.
type AdminStore interface {
	CreateSKU(ctx context.Context, s stock.SKU, initial int64) error
	GetSKU(ctx context.Context, sku string) (*stock.SKU, error)
	UpdateSKU(ctx context.Context, sku string, u stock.SKUUpdate) (*stock.SKU, error)
	ResumeShard(ctx context.Context, k stock.ShardKey) (string, error)
	ListTransfers(ctx context.Context, f stock.TransferFilter, afterID string, limit int) ([]*stock.Transfer, error)
	// StockRead reads a SKU's shards, totals, stock in transit and open
	// transfers in one snapshot.
	StockRead(ctx context.Context, sku string, movingMax int) (*stock.StockRead, error)
	InTransitTotal(ctx context.Context) (int64, error)
	ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error)
	Snapshot(ctx context.Context, sku string) (ledger.Snapshot, error)
}
