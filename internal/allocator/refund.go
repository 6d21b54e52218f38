package allocator

import (
	"context"

	"github.com/shardstock/shardstock/internal/stock"
)

// Refund gives back units of a sale (r.Original). It goes to the sale's
// shard: sold moves back to available there, and that shard sold at least
// what the sale has left to refund. A shard the sale was made on that is
// out of service now (SetShards made the SKU smaller) would strand the
// units, so the refund goes to a shard in service that sold as much
// instead. Wherever it lands, the sale's cap is one row in the SKU's
// database (internal/postgres, refunds) that every refund of the sale
// adds to under a guard: exact across shards and writers.
func (a *Allocator) Refund(ctx context.Context, r *stock.Request) stock.Result {
	r.Kind = stock.OpRefund
	sku, err := a.prepare(ctx, r)
	if err != nil {
		return errResult(err)
	}
	if a.memory.marks != nil {
		// A refund brings stock back: a SKU marked sold out is reopened
		// first, as by a replenish (docs/soldout.md).
		return a.reopen(ctx, r, sku)
	}
	res, _ := a.sendRefund(ctx, r, sku)
	return res
}

// sendRefund sends a refund to the shard its sale was made on (or, when
// that shard left service, one that sold enough). inDoubt: the shard was
// reached and answered SHARD_UNAVAILABLE, so it may still apply it.
func (a *Allocator) sendRefund(ctx context.Context, r *stock.Request, sku *stock.SKU) (res stock.Result, inDoubt bool) {
	k, err := a.saleShard(ctx, r.Shard.SKU, r.Original)
	if err != nil {
		return errResult(err), false
	}
	if k.Index >= sku.Shards {
		rows, _, _, err := a.db.SoldOutCheck(ctx, sku.Name, nil)
		if err != nil {
			return errResult(err), false
		}
		for _, row := range rows {
			if row.Index < sku.Shards && row.Sold >= r.Quantity && row.HaltReason == "" {
				k.Index = row.Index
				break
			}
		}
	}
	r.Shard = k
	flight := r.Shard.SKU + "\x00" + r.Key
	a.inflight.Store(flight, struct{}{})
	defer a.inflight.Delete(flight)
	res, reached := a.send(ctx, r)
	return res, reached && res.Err != nil && res.Err.Code == stock.CodeShardUnavailable
}

// saleShard is the shard a sale was made on: a reservation's id names it;
// a deduct's operation records it.
func (a *Allocator) saleShard(ctx context.Context, sku string, s stock.Sale) (stock.ShardKey, error) {
	if s.ReservationID != "" {
		return stock.ParseReservationID(s.ReservationID)
	}
	op, err := a.db.GetOperation(ctx, sku, s.DeductKey)
	if stock.CodeOf(err) == stock.CodeOperationNotFound || (err == nil && op.Kind != stock.OpDeduct) {
		return stock.ShardKey{}, stock.Errorf(stock.CodeSaleNotFound, "no deduct of %q with key %q", sku, s.DeductKey)
	}
	if err != nil {
		return stock.ShardKey{}, err
	}
	return stock.ShardKey{SKU: sku, Index: op.Shard}, nil
}
