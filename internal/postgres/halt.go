package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// CheckShard reads a shard's row and what its ledger says the row must be
// in one transaction, under f's fence (stock.ErrFenced if another server
// owns the partition now): the check a writer makes when its copy of the
// row turned out wrong. The ledger's word is the shard's latest checkpoint
// (or its opening balance) plus the entries after it: fewer than
// ledger.CheckpointEntries and one batch's, however long the ledger.
func (db *DB) CheckShard(ctx context.Context, f stock.Fence, k stock.ShardKey) (stock.ShardCheck, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var c stock.ShardCheck
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return c, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := checkFence(ctx, tx, f); err != nil {
		return c, err
	}
	// One read: the row, its latest checkpoint (or its opening balance)
	// and the sums of the entries after it (OFFSET 0: see sqlTail).
	err = tx.QueryRow(ctx, `SELECT s.available, s.reserved, s.sold, s.halted_reason,
			coalesce(c.available, s.opening_available) + t.a, coalesce(c.reserved, 0) + t.r, coalesce(c.sold, 0) + t.s
		FROM shards s LEFT JOIN LATERAL (`+sqlLatestCheckpoint+`) c ON true
		CROSS JOIN LATERAL (SELECT coalesce(sum(available_after - available_before), 0) AS a,
			coalesce(sum(reserved_after - reserved_before), 0) AS r, coalesce(sum(sold_after - sold_before), 0) AS s
			FROM (SELECT * FROM ledger l WHERE l.sku = s.sku AND l.shard = s.idx AND l.id > coalesce(c.entry_id, 0) OFFSET 0) l) t
		WHERE s.sku = $1 AND s.idx = $2`, k.SKU, k.Index).Scan(&c.Row.Available, &c.Row.Reserved, &c.Row.Sold, &c.HaltReason,
		&c.Ledger.Available, &c.Ledger.Reserved, &c.Ledger.Sold)
	if isNoRows(err) {
		return c, stock.Errorf(stock.CodeSKUNotFound, "sku %q has no shard %d", k.SKU, k.Index)
	}
	if err != nil {
		return c, err
	}
	return c, tx.Commit(ctx)
}

// HaltShard records why a shard is halted, under f's fence.
func (db *DB) HaltShard(ctx context.Context, f stock.Fence, k stock.ShardKey, reason string) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := checkFence(ctx, tx, f); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE shards SET halted_reason = $3, updated_at = now() WHERE sku = $1 AND idx = $2`, k.SKU, k.Index, reason); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// ResumeShard clears a shard's halt and returns the reason it had. A shard
// that was not halted is FAILED_PRECONDITION (SHARD_NOT_HALTED).
func (db *DB) ResumeShard(ctx context.Context, k stock.ShardKey) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var was string
	err := db.pool.QueryRow(ctx, `UPDATE shards s SET halted_reason = '', updated_at = now()
		FROM (SELECT halted_reason FROM shards WHERE sku = $1 AND idx = $2 FOR UPDATE) old
		WHERE s.sku = $1 AND s.idx = $2 RETURNING old.halted_reason`, k.SKU, k.Index).Scan(&was)
	if isNoRows(err) {
		return "", stock.Errorf(stock.CodeSKUNotFound, "sku %q has no shard %d", k.SKU, k.Index)
	}
	if err != nil {
		return "", err
	}
	if was == "" {
		return "", stock.Errorf(stock.CodeShardNotHalted, "shard %d of sku %q is not halted", k.Index, k.SKU)
	}
	return was, nil
}

// checkFence locks f's partition row FOR SHARE (a takeover waits for this
// transaction) and fails with stock.ErrFenced unless f still owns it.
func checkFence(ctx context.Context, tx pgx.Tx, f stock.Fence) error {
	var owner string
	var epoch int64
	err := tx.QueryRow(ctx, `SELECT owner, epoch FROM partitions WHERE partition = $1 FOR SHARE`, f.Partition).Scan(&owner, &epoch)
	if err != nil {
		return err
	}
	if owner != f.ServerID || epoch != f.Epoch {
		return fmt.Errorf("%w: partition %d is %s@%d, writer is %s@%d", stock.ErrFenced, f.Partition, owner, epoch, f.ServerID, f.Epoch)
	}
	return nil
}
