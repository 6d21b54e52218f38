package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

const sqlSelectTransfers = `SELECT id, sku, from_shard, to_shard, quantity, state, fence_token, reason, created_at FROM transfers`

func scanTransfer(row pgx.Row) (*stock.Transfer, error) {
	var t stock.Transfer
	var state string
	err := row.Scan(&t.ID, &t.SKU, &t.From, &t.To, &t.Quantity, &state, &t.FenceToken, &t.Reason, &t.CreatedAt)
	t.State = stock.TransferState(state)
	return &t, err
}

func scanTransfers(res pgx.BatchResults) ([]*stock.Transfer, error) {
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Transfer, error) { return scanTransfer(r) })
}

// queueStepTransfers moves transfers on; the from-state guard makes a step
// that someone else took a mismatch (only the shard's writer steps it).
func queueStepTransfers(b *pgx.Batch, steps []stock.TransferStep) {
	n := len(steps)
	id, from, to := make([]string, n), make([]string, n), make([]string, n)
	for i, s := range steps {
		id[i], from[i], to[i] = s.ID, string(s.From), string(s.To)
	}
	b.Queue(`WITH s AS (UPDATE transfers t SET state = u.next, updated_at = now()
		FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, prev, next)
		WHERE t.id = u.id AND t.state = u.prev RETURNING 1)
		SELECT shardstock_expect(count(*), $4, 'transfer steps', 'SS001') FROM s`, id, from, to, n)
}

// CreateTransfer records a pending transfer.
func (db *DB) CreateTransfer(ctx context.Context, t *stock.Transfer) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	_, err := db.pool.Exec(ctx, `INSERT INTO transfers (id, sku, from_shard, to_shard, from_partition, to_partition, quantity, state, fence_token, reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9)`,
		t.ID, t.SKU, t.From, t.To, stock.PartitionOf(t.SKU, t.From), stock.PartitionOf(t.SKU, t.To), t.Quantity, t.FenceToken, t.Reason)
	return err
}

// GetTransfer reads one transfer.
func (db *DB) GetTransfer(ctx context.Context, id string) (*stock.Transfer, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	t, err := scanTransfer(db.pool.QueryRow(ctx, sqlSelectTransfers+` WHERE id = $1`, id))
	if isNoRows(err) {
		return nil, stock.Errorf(stock.CodeInvalidArgument, "no transfer %q", id)
	}
	return t, err
}

// StaleTransfers lists transfers left half-way for longer than age whose
// next step belongs to one of the given partitions.
func (db *DB) StaleTransfers(ctx context.Context, partitions []int32, age time.Duration, limit int) ([]stock.StaleStep, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT id, sku, state, from_shard, to_shard FROM transfers
		WHERE state IN ('pending', 'debited') AND updated_at < now() - $2::interval
		AND ((state = 'pending' AND from_partition = ANY($1)) OR (state = 'debited' AND to_partition = ANY($1)))
		ORDER BY updated_at LIMIT $3`, partitions, age, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (stock.StaleStep, error) {
		var s stock.StaleStep
		var state string
		var from, to int32
		err := r.Scan(&s.Transfer, &s.Shard.SKU, &state, &from, &to)
		s.Kind, s.Shard.Index = stock.OpTransferOut, from
		if state == string(stock.TransferDebited) {
			s.Kind, s.Shard.Index = stock.OpTransferIn, to
		}
		return s, err
	})
}

// InTransit sums a SKU's debited, not yet credited transfers.
func (db *DB) InTransit(ctx context.Context, sku string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM transfers WHERE sku = $1 AND state = 'debited'`, sku).Scan(&n)
	return n, err
}

// ListTransfers returns up to limit transfers of a SKU (all SKUs when sku is
// empty) created after the transfer named by after, oldest first.
func (db *DB) ListTransfers(ctx context.Context, sku string, afterID string, limit int) ([]*stock.Transfer, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	limit = min(max(limit, 1), ledgerPageMax)
	rows, err := db.pool.Query(ctx, sqlSelectTransfers+` WHERE ($1 = '' OR sku = $1)
		AND ($2 = '' OR (created_at, id) > (SELECT created_at, id FROM transfers WHERE id = $2))
		ORDER BY created_at, id LIMIT $3`, sku, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Transfer, error) { return scanTransfer(r) })
}
