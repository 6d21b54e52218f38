package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// ErrStaleEpoch: a takeover named an epoch not newer than the partition's.
var ErrStaleEpoch = errors.New("postgres: partition owned at a newer epoch")

// TakeOver makes server the owner of partition at epoch. It waits for every
// batch of the previous owner that holds the partition row FOR SHARE, so
// once it returns no batch at an older epoch can commit. A batch that holds
// it past blockerGrace (its server stopped or cut off mid-transaction) is
// ended: its server lost the partition in etcd already, and learns its
// batch's outcome from the commit mark when it wakes. A batch that waits
// for a synchronous standby is not ended (execEndingBlockers): the
// takeover waits for the standby with it. The UPDATE's own commit follows
// every batch it waited for, so once it returns, with a synchronous
// standby, the standby holds them all, and the rows the new owner reads
// are durable.
func (db *DB) TakeOver(ctx context.Context, partition int32, server string, epoch int64) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: take over partition %d: %w", partition, err)
	}
	defer conn.Release()
	tag, err := db.execEndingBlockers(ctx, conn, `UPDATE partitions SET owner = $2, epoch = $3, updated_at = now()
		WHERE partition = $1 AND epoch < $3`, partition, server, epoch)
	if err != nil {
		return fmt.Errorf("postgres: take over partition %d: %w", partition, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var owner string
	var cur int64
	if err := conn.QueryRow(ctx, `SELECT owner, epoch FROM partitions WHERE partition = $1`, partition).Scan(&owner, &cur); err != nil {
		return fmt.Errorf("postgres: take over partition %d: %w", partition, err)
	}
	if owner == server && cur == epoch {
		// Already ours at this epoch: an earlier attempt's UPDATE
		// committed, but its answer was lost, and with it the word that a
		// synchronous standby holds it. The caller reads the rows next.
		if err := confirmDurable(ctx, conn, server); err != nil {
			return fmt.Errorf("postgres: take over partition %d: %w", partition, err)
		}
		return nil
	}
	return fmt.Errorf("%w: partition %d is %s@%d, asked %s@%d", ErrStaleEpoch, partition, owner, cur, server, epoch)
}

// PartitionOwner returns the owner and epoch of a partition as the
// database has them.
func (db *DB) PartitionOwner(ctx context.Context, partition int32) (string, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var owner string
	var epoch int64
	err := db.pool.QueryRow(ctx, `SELECT owner, epoch FROM partitions WHERE partition = $1`, partition).Scan(&owner, &epoch)
	return owner, epoch, err
}

// LoadShard reads one shard's counts. A missing shard (or SKU) is
// SKU_NOT_FOUND.
func (db *DB) LoadShard(ctx context.Context, k stock.ShardKey) (stock.Counts, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var c stock.Counts
	err := db.pool.QueryRow(ctx, `SELECT available, reserved, sold FROM shards WHERE sku = $1 AND idx = $2`, k.SKU, k.Index).
		Scan(&c.Available, &c.Reserved, &c.Sold)
	if isNoRows(err) {
		return c, stock.Errorf(stock.CodeSKUNotFound, "sku %q has no shard %d", k.SKU, k.Index)
	}
	return c, err
}

// sqlShardsInSpan are the shards of a SKU ($1) in its span, by index, with
// whether each is being retired.
const sqlShardsInSpan = `FROM shards s JOIN skus k ON k.sku = s.sku WHERE s.sku = $1 AND s.idx < k.shard_span ORDER BY s.idx`

// Shards reads every shard of a SKU in its span (in service or being
// retired), by index. Shards retired hold nothing and are left out; their
// sales are counted in StockRead's totals.
func (db *DB) Shards(ctx context.Context, sku string) ([]stock.ShardRow, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, _, err := shardsOf(ctx, db.pool, sku)
	return rows, err
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// shardsOf reads every shard row of a SKU once: it returns those in the
// SKU's span, by index, and the sum of all of them, retired ones included.
func shardsOf(ctx context.Context, q querier, sku string) (inSpan []stock.ShardRow, total stock.Counts, err error) {
	rows, err := q.Query(ctx, `SELECT s.idx, s.available, s.reserved, s.sold, s.halted_reason, s.idx >= k.shards, s.idx < k.shard_span
		FROM shards s JOIN skus k ON k.sku = s.sku WHERE s.sku = $1 ORDER BY s.idx`, sku)
	if err != nil {
		return nil, total, err
	}
	var s stock.ShardRow
	var spanned bool
	_, err = pgx.ForEachRow(rows, []any{&s.Index, &s.Available, &s.Reserved, &s.Sold, &s.HaltReason, &s.Retiring, &spanned}, func() error {
		total.Available, total.Reserved, total.Sold = total.Available+s.Available, total.Reserved+s.Reserved, total.Sold+s.Sold
		if spanned {
			inSpan = append(inSpan, s)
		}
		return nil
	})
	return inSpan, total, err
}

// StockRead reads a SKU's shards and their totals, its stock in transit
// and at most movingMax open transfers in one snapshot (a read-only REPEATABLE READ
// transaction): read one by one, a transfer debited between two reads
// would be counted twice or nowhere.
func (db *DB) StockRead(ctx context.Context, sku string, movingMax int) (*stock.StockRead, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	out := &stock.StockRead{}
	err := pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if out.Shards, out.Totals, err = shardsOf(ctx, tx, sku); err != nil {
			return err
		}
		if out.InTransit, err = inTransitOf(ctx, tx, sku); err != nil {
			return err
		}
		out.Moving, err = openTransfersOf(ctx, tx, sku, movingMax)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DueShards lists shards in the given partitions that have held
// reservations past their expiry, at most limit of them.
func (db *DB) DueShards(ctx context.Context, partitions []int32, limit int) ([]stock.ShardKey, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT DISTINCT sku, shard FROM reservations
		WHERE partition = ANY($1) AND state = 'held' AND expires_at <= now() LIMIT $2`, partitions, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (stock.ShardKey, error) {
		var k stock.ShardKey
		err := r.Scan(&k.SKU, &k.Index)
		return k, err
	})
}

// LookupOperations reads a SKU's operations of keys, by key, without a
// transaction: the read a writer does before refusing a batch for stock,
// so that a replay is never answered OUT_OF_STOCK.
func (db *DB) LookupOperations(ctx context.Context, sku string, keys []string) (map[string]*stock.Operation, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return scanOps(db.pool.Query(ctx, sqlSelectOps, opKeys(sku, keys)...))
}

// GetOperation reads one operation by SKU and key.
func (db *DB) GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error) {
	ops, err := db.LookupOperations(ctx, sku, []string{key})
	if err != nil {
		return nil, err
	}
	o := ops[key]
	if o == nil {
		return nil, stock.Errorf(stock.CodeOperationNotFound, "no operation with key %q on sku %q", key, sku)
	}
	return o, nil
}

// SoldOutCheck reads every shard of a SKU (with why it is halted, if it is) and
// its stock in transit in one statement, so in one snapshot: a transfer is
// counted exactly once, on its source, in transit or on its destination,
// however its steps interleave with the read. In the same round trip it
// looks the SKU's keys up (the operations a sold-out answer must replay),
// as LookupOperations does.
func (db *DB) SoldOutCheck(ctx context.Context, sku string, keys []string) ([]stock.ShardRow, int64, map[string]*stock.Operation, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(`SELECT s.idx, s.available, s.reserved, s.sold, s.halted_reason, s.idx >= k.shards,
		(SELECT coalesce(sum(quantity), 0) FROM transfers WHERE sku = $1 AND state = 'debited') `+sqlShardsInSpan, sku)
	if len(keys) > 0 {
		b.Queue(sqlSelectOps, opKeys(sku, keys)...)
	}
	res := db.pool.SendBatch(ctx, b)
	defer res.Close()
	rows, err := res.Query()
	if err != nil {
		return nil, 0, nil, err
	}
	var inTransit int64
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stock.ShardRow, error) {
		var s stock.ShardRow
		err := r.Scan(&s.Index, &s.Available, &s.Reserved, &s.Sold, &s.HaltReason, &s.Retiring, &inTransit)
		return s, err
	})
	if err != nil {
		return nil, 0, nil, err
	}
	ops := map[string]*stock.Operation{}
	if len(keys) > 0 {
		if ops, err = scanOps(res.Query()); err != nil {
			return nil, 0, nil, err
		}
	}
	return out, inTransit, ops, res.Close()
}

// OperationKeys calls each with every key of a SKU's operations, at most
// limit of them (one index-only range of the operations' key), and
// returns how many there were, up to limit+1: more than limit means the
// listing stopped short. A sold-out SKU's allocators keep them to tell a
// new key from a replay without a query (docs/soldout.md).
func (db *DB) OperationKeys(ctx context.Context, sku string, limit int, each func(key string)) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT idempotency_key FROM operations WHERE sku = $1 LIMIT $2`, sku, limit+1)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	var key string
	for rows.Next() {
		if err := rows.Scan(&key); err != nil {
			return 0, err
		}
		if n++; n <= limit {
			each(key)
		}
	}
	return n, rows.Err()
}

// ResetFences forgets every partition's owner and epoch, every SKU's
// move fence and the placement lock's fence (the placement recorded stays:
// a new etcd gets it back from it). Epochs and tokens are etcd
// revisions, so a new etcd cluster starts them again from 1, below the
// epochs a database kept from the last one, and no takeover could pass. Only
// for a database that no shard server is using: the dev stack calls it when
// it starts its own embedded etcd on a database it may have used before.
func (db *DB) ResetFences(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if _, err := db.pool.Exec(ctx, `UPDATE partitions SET owner = '', epoch = 0, updated_at = now() WHERE epoch <> 0`); err != nil {
		return err
	}
	if _, err := db.pool.Exec(ctx, `UPDATE placement_record SET fence = 0, updated_at = now() WHERE fence <> 0`); err != nil {
		return err
	}
	_, err := db.pool.Exec(ctx, `DELETE FROM move_fences`) // tokens are etcd revisions too
	return err
}
