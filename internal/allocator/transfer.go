package allocator

import (
	"context"
	"errors"
	"sync"

	"github.com/shardstock/shardstock/internal/stock"
)

// consolidate moves stock so that one shard holds q units: a request larger
// than any one shard but not than the SKU must not be refused. Each move is
// a two-phase, ledgered transfer (debit on the source's owner, credit on the
// target's); one that fails half-way is finished by the shard servers'
// sweep, and the stock counts as in transit meanwhile.
func (a *Allocator) consolidate(ctx context.Context, sku *stock.SKU, q int64) error {
	target, moves := consolidation(a.hintsOf(sku.Name, sku.Shards), q, a.skipper(sku.Name))
	if moves == nil {
		return errors.New("allocator: the reachable shards do not hold enough")
	}
	var wg sync.WaitGroup
	errs := make([]error, len(moves))
	for i, m := range moves {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.transfer(ctx, sku.Name, m.from, target, m.quantity, "consolidate for a request of "+itoa(q))
		}()
	}
	wg.Wait()
	a.metrics.consolidations.Inc()
	return errors.Join(errs...)
}

// transfer runs one transfer to the end (or to where the sweep takes over).
func (a *Allocator) transfer(ctx context.Context, sku string, from, to int32, q int64, reason string) error {
	t := &stock.Transfer{ID: stock.NewTransferID(), SKU: sku, From: from, To: to, Quantity: q, Reason: reason}
	if err := a.db.CreateTransfer(ctx, t); err != nil {
		return err
	}
	out := a.exec(ctx, &stock.Request{Kind: stock.OpTransferOut, Shard: stock.ShardKey{SKU: sku, Index: from}, TransferID: t.ID, Source: stock.SourceAllocator})
	if out.Err != nil {
		return out.Err
	}
	in := a.exec(ctx, &stock.Request{Kind: stock.OpTransferIn, Shard: stock.ShardKey{SKU: sku, Index: to}, TransferID: t.ID, Source: stock.SourceAllocator})
	if in.Err != nil {
		return in.Err
	}
	return nil
}
