package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// SetShards sets the number of a SKU's shards in service and returns the SKU
// as it now is. Growing creates the shards not made before (empty: the
// rebalancer spreads stock to them) and takes back into service any that
// were being retired; shrinking takes shards n.. out of service, and they
// stay in the SKU's span until FinishRetirement. The writers read the SKU in
// every batch, so from the commit on no batch starts a new reserve or
// deduct on a shard out of service. A shrink while shards of an earlier one
// are still being retired is SHARDS_RETIRING.
func (db *DB) SetShards(ctx context.Context, sku string, n int32) (*stock.SKU, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	cur, err := scanSKU(tx.QueryRow(ctx, sqlSelectSKU+` = $1 FOR UPDATE`, sku))
	if isNoRows(err) {
		return nil, stock.Errorf(stock.CodeSKUNotFound, "no sku %q", sku)
	}
	if err != nil {
		return nil, err
	}
	if n < cur.Shards && cur.ShardSpan > cur.Shards {
		return nil, stock.Errorf(stock.CodeShardsRetiring,
			"shards %d..%d of %q are still being retired; shrink again once GetStock lists them no more", cur.Shards, cur.ShardSpan-1, sku)
	}
	if n > cur.ShardSpan {
		idx, part := make([]int32, 0, n-cur.ShardSpan), make([]int32, 0, n-cur.ShardSpan)
		for i := cur.ShardSpan; i < n; i++ {
			idx, part = append(idx, i), append(part, stock.PartitionOf(sku, i))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO shards (sku, idx, partition, available, reserved, sold, opening_available)
			SELECT $1, i, p, 0, 0, 0, 0 FROM unnest($2::int[], $3::int[]) AS u(i, p)
			ON CONFLICT (sku, idx) DO NOTHING`, sku, idx, part); err != nil {
			return nil, err
		}
	}
	s, err := scanSKU(tx.QueryRow(ctx, `UPDATE skus SET shards = $2, shard_span = greatest(shard_span, $2), updated_at = now()
		WHERE sku = $1 RETURNING `+sqlSKUColumns, sku, n))
	if err != nil {
		return nil, err
	}
	return s, tx.Commit(ctx)
}

// FinishRetirement ends the retirement of a SKU's shards out of service
// (shard_span = shards) when none of them holds stock or reservations and
// no transfer in flight touches them, and the SKU's layout has not changed
// for grace: a batch that read the layout before the change has ended by
// then. It reports whether the retirement is finished.
func (db *DB) FinishRetirement(ctx context.Context, sku string, grace time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tag, err := db.pool.Exec(ctx, `UPDATE skus k SET shard_span = shards, updated_at = now()
		WHERE sku = $1 AND shard_span > shards AND updated_at < now() - $2::interval
		AND NOT EXISTS (SELECT 1 FROM shards s WHERE s.sku = k.sku AND s.idx >= k.shards AND (s.available > 0 OR s.reserved > 0))
		AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.sku = k.sku AND t.state IN ('pending', 'debited')
			AND (t.from_shard >= k.shards OR t.to_shard >= k.shards))`, sku, grace)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	var retiring bool
	err = db.pool.QueryRow(ctx, `SELECT shard_span > shards FROM skus WHERE sku = $1`, sku).Scan(&retiring)
	return !retiring, err
}

// RetiringSKUs lists up to limit SKUs with shards still being retired.
func (db *DB) RetiringSKUs(ctx context.Context, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT sku FROM skus WHERE shard_span > shards ORDER BY sku LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
