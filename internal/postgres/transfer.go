package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

const sqlSelectTransfers = `SELECT id, sku, from_shard, to_shard, quantity, state, fence_token, reason, created_at, updated_at FROM transfers`

func scanTransfer(row pgx.Row) (*stock.Transfer, error) {
	var t stock.Transfer
	var state string
	err := row.Scan(&t.ID, &t.SKU, &t.From, &t.To, &t.Quantity, &state, &t.FenceToken, &t.Reason, &t.CreatedAt, &t.UpdatedAt)
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
// that someone else took a mismatch (only the shard's writer steps it). A
// debit also needs the transfer's fence token to be at least the SKU's
// move fence, which it locks FOR SHARE: a mover raising the fence waits
// for this batch, and a batch after the raise sees it. A mismatch reruns
// the batch, whose planner then sees the raised fence and aborts the
// transfer.
func queueStepTransfers(b *pgx.Batch, steps []stock.TransferStep) {
	n := len(steps)
	id, from, to := make([]string, n), make([]string, n), make([]string, n)
	for i, s := range steps {
		id[i], from[i], to[i] = s.ID, string(s.From), string(s.To)
	}
	b.Queue(`WITH s AS (UPDATE transfers t SET state = u.next, updated_at = now()
		FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, prev, next)
		WHERE t.id = u.id AND t.state = u.prev
		AND (u.next <> 'debited' OR t.fence_token >= coalesce((SELECT f.token FROM move_fences f WHERE f.sku = t.sku FOR SHARE), 0))
		RETURNING 1)
		SELECT shardstock_expect(count(*), $4, 'transfer steps', 'SS001') FROM s`, id, from, to, n)
}

// sqlSelectTransfersFenced reads transfers by id with their SKU's move
// fence, for the planner.
const sqlSelectTransfersFenced = `SELECT t.*, coalesce((SELECT f.token FROM move_fences f WHERE f.sku = t.sku), 0)
	FROM (SELECT unnest($1::text[]) AS id) AS k CROSS JOIN LATERAL (` + sqlSelectTransfers + ` WHERE id = k.id) t`

// scanTransfersFenced scans sqlSelectTransfersFenced into transfers by id
// and fences by SKU.
func scanTransfersFenced(res pgx.BatchResults, into map[string]*stock.Transfer, fences map[string]int64) error {
	rows, err := res.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var t stock.Transfer
		var state string
		var fence int64
		if err := rows.Scan(&t.ID, &t.SKU, &t.From, &t.To, &t.Quantity, &state, &t.FenceToken, &t.Reason, &t.CreatedAt, &t.UpdatedAt, &fence); err != nil {
			return err
		}
		t.State = stock.TransferState(state)
		into[t.ID], fences[t.SKU] = &t, fence
	}
	return rows.Err()
}

// RaiseMoveFence records that the holder of a SKU's rebalance lease with
// token now moves it: from the commit on, no transfer with a lower token is
// created or debited. A token below the fence already recorded is
// MOVE_FENCED: a newer mover took the SKU over.
func (db *DB) RaiseMoveFence(ctx context.Context, sku string, token int64, holder string) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var got int64
	err := db.pool.QueryRow(ctx, `INSERT INTO move_fences (sku, token, holder) VALUES ($1, $2, $3)
		ON CONFLICT (sku) DO UPDATE SET token = greatest(move_fences.token, excluded.token),
			holder = CASE WHEN excluded.token >= move_fences.token THEN excluded.holder ELSE move_fences.holder END,
			updated_at = now()
		RETURNING token`, sku, token, holder).Scan(&got)
	if err != nil {
		return err
	}
	if got > token {
		return stock.Errorf(stock.CodeMoveFenced, "a newer mover (token %d) holds %q", got, sku)
	}
	return nil
}

// CreateTransfer records a pending transfer, if its fence token is at
// least the SKU's move fence (locked FOR SHARE, so a raise waits for it),
// else MOVE_FENCED; and if its destination would hold at most
// stock.ShardCountMax once credited, else INVALID_QUANTITY. A refused
// transfer writes nothing. The destination's row is read, not locked: its
// writer would wait on the lock, and a credit is never refused (the units
// must land), so inflows racing the move may take it past the ceiling by
// at most the moves in flight.
func (db *DB) CreateTransfer(ctx context.Context, t *stock.Transfer) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var fence, held, created int64
	err := db.pool.QueryRow(ctx, `WITH f AS (SELECT coalesce((SELECT token FROM move_fences WHERE sku = $2 FOR SHARE), 0) AS token),
			d AS (SELECT coalesce((SELECT available + reserved FROM shards WHERE sku = $2 AND idx = $4), 0) AS held),
			ins AS (INSERT INTO transfers (id, sku, from_shard, to_shard, from_partition, to_partition, quantity, state, fence_token, reason)
				SELECT $1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9 FROM f, d
				WHERE $8 >= f.token AND d.held <= $10::bigint - $7
				RETURNING 1)
		SELECT f.token, d.held, (SELECT count(*) FROM ins) FROM f, d`,
		t.ID, t.SKU, t.From, t.To, stock.PartitionOf(t.SKU, t.From), stock.PartitionOf(t.SKU, t.To), t.Quantity, t.FenceToken, t.Reason,
		int64(stock.ShardCountMax)).Scan(&fence, &held, &created)
	switch {
	case err != nil || created == 1:
		return err
	case t.FenceToken < fence:
		return stock.Errorf(stock.CodeMoveFenced, "a newer mover holds %q: transfer with token %d refused", t.SKU, t.FenceToken)
	default:
		return stock.Errorf(stock.CodeInvalidQuantity, "a transfer of %d would take shard %d of %q past %d units held (available plus reserved); it holds %d",
			t.Quantity, t.To, t.SKU, int64(stock.ShardCountMax), held)
	}
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

// openTransfersOf lists up to limit of a SKU's transfers in flight (pending
// or debited), oldest first.
func openTransfersOf(ctx context.Context, q querier, sku string, limit int) ([]*stock.Transfer, error) {
	rows, err := q.Query(ctx, sqlSelectTransfers+` WHERE sku = $1 AND state IN ('pending', 'debited')
		ORDER BY created_at, id LIMIT $2`, sku, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Transfer, error) { return scanTransfer(r) })
}

// InTransitTotal sums every SKU's debited, not yet credited transfers.
func (db *DB) InTransitTotal(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM transfers WHERE state = 'debited'`).Scan(&n)
	return n, err
}

// InTransit sums a SKU's debited, not yet credited transfers.
func (db *DB) InTransit(ctx context.Context, sku string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return inTransitOf(ctx, db.pool, sku)
}

func inTransitOf(ctx context.Context, q querier, sku string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM transfers WHERE sku = $1 AND state = 'debited'`, sku).Scan(&n)
	return n, err
}

// ListTransfers returns up to limit transfers that f selects, created after
// the transfer named by after, oldest first (none if after names none).
func (db *DB) ListTransfers(ctx context.Context, f stock.TransferFilter, afterID string, limit int) ([]*stock.Transfer, error) {
	var from stock.TransferCursor
	if afterID != "" {
		t, err := db.GetTransfer(ctx, afterID)
		if stock.CodeOf(err) == stock.CodeInvalidArgument {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		from = stock.TransferCursor{CreatedAt: t.CreatedAt, ID: t.ID}
	}
	return db.ListTransfersFrom(ctx, f, from, limit)
}

// transferPageMax bounds a ListTransfersFrom page.
const transferPageMax = 1000

// ListTransfersFrom returns up to limit transfers that f selects, ordered by
// creation, after from (from the first if from is zero).
func (db *DB) ListTransfersFrom(ctx context.Context, f stock.TransferFilter, from stock.TransferCursor, limit int) ([]*stock.Transfer, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	limit = min(max(limit, 1), transferPageMax)
	rows, err := db.pool.Query(ctx, sqlSelectTransfers+` WHERE ($1 = '' OR sku = $1) AND ($4 = '' OR state = $4)
		AND ($2 = '' OR (created_at, id) > ($5::timestamptz, $2::text))
		ORDER BY created_at, id LIMIT $3`, f.SKU, from.ID, limit, string(f.State), from.CreatedAt)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Transfer, error) { return scanTransfer(r) })
}
