package allocator

import (
	"context"
	"sync"

	"github.com/shardstock/shardstock/internal/stock"
)

// Prewarm does for a SKU now what its first requests would do lazily, so
// that the first request of a sale costs what the thousandth does: the SKU
// is read into this allocator's cache, every shard in service gets a warm
// request (stock.OpWarm) from its owner, which starts the shard's writer
// and reads its row in a batch transaction of its own (with the partition
// taken over in the SKU's database, a pooled connection used), the
// connection to each shard server is opened, and each answer leaves its
// shard's hint. It returns the SKU's stock and how many shards are warm;
// a shard whose owner cannot be reached is SHARD_UNAVAILABLE (Prewarm may
// be called again: it changes no stock).
func (a *Allocator) Prewarm(ctx context.Context, name string) (*stock.Stock, int32, error) {
	if err := stock.ValidateSKU(name); err != nil {
		return nil, 0, err
	}
	a.forgetSKU(name) // a fresh read: the copy a sale starts with
	sku, err := a.sku(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	results := make([]stock.Result, sku.Shards)
	var wg sync.WaitGroup
	for i := range sku.Shards {
		wg.Go(func() {
			results[i] = a.exec(ctx, &stock.Request{Kind: stock.OpWarm, Shard: stock.ShardKey{SKU: name, Index: i}})
		})
	}
	wg.Wait()
	var warm int32
	var firstErr error
	for _, r := range results {
		if r.Err != nil {
			if firstErr == nil {
				firstErr = r.Err
			}
			continue
		}
		warm++
	}
	if firstErr != nil {
		return nil, warm, firstErr
	}
	st, err := a.GetStock(ctx, name)
	return st, warm, err
}
