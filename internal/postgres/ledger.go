package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
)

// mismatchesMax bounds how many unpaired keys or reservations a
// reconciliation lists.
const mismatchesMax = 100

// Snapshot reads everything reconciliation needs of a SKU in one
// repeatable-read transaction, so that all of it is of one instant: the
// shard rows, then one step per check, each reading its own query.
func (db *DB) Snapshot(ctx context.Context, sku string) (ledger.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	snap := ledger.Snapshot{SKU: sku}
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return snap, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	sn := &snapshot{tx: tx, sku: sku, snap: &snap}
	if err := sn.shards(ctx); err != nil {
		return snap, err
	}
	for _, step := range []func(context.Context) error{
		sn.kindSums, sn.chains, sn.held, sn.keyed, sn.ends, sn.transfers, sn.inTransit,
	} {
		if err := step(ctx); err != nil {
			return snap, err
		}
	}
	return snap, tx.Commit(ctx)
}

// snapshot is one Snapshot in progress.
type snapshot struct {
	tx      pgx.Tx
	sku     string
	snap    *ledger.Snapshot
	byIndex map[int32]*ledger.Shard
}

// shards reads the SKU's shard rows; none is SKU_NOT_FOUND.
func (sn *snapshot) shards(ctx context.Context) error {
	rows, err := sn.tx.Query(ctx, `SELECT idx, available, reserved, sold, opening_available FROM shards WHERE sku = $1 ORDER BY idx`, sn.sku)
	if err != nil {
		return err
	}
	sn.snap.Shards, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledger.Shard, error) {
		s := ledger.Shard{Kinds: map[stock.OpKind]ledger.KindSum{}}
		err := r.Scan(&s.Index, &s.Row.Available, &s.Row.Reserved, &s.Row.Sold, &s.Opening.Available)
		return s, err
	})
	if err != nil {
		return err
	}
	if len(sn.snap.Shards) == 0 {
		return stock.Errorf(stock.CodeSKUNotFound, "no sku %q", sn.sku)
	}
	sn.byIndex = map[int32]*ledger.Shard{}
	for i := range sn.snap.Shards {
		sn.byIndex[sn.snap.Shards[i].Index] = &sn.snap.Shards[i]
	}
	return nil
}

// shard returns the shard of index i; the ledger naming a shard the SKU
// lacks is an error.
func (sn *snapshot) shard(i int32) (*ledger.Shard, error) {
	if s := sn.byIndex[i]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("postgres: snapshot: ledger names shard %d that %s lacks", i, sn.sku)
}

// each runs sql (its first argument the SKU, then args) and calls row after
// scanning every row into dest.
func (sn *snapshot) each(ctx context.Context, dest []any, row func() error, sql string, args ...any) error {
	rows, err := sn.tx.Query(ctx, sql, append([]any{sn.sku}, args...)...)
	if err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, dest, row)
	return err
}

// kindSums reads the ledger's sums by shard and kind.
func (sn *snapshot) kindSums(ctx context.Context) error {
	var idx int32
	var kind string
	var k ledger.KindSum
	return sn.each(ctx, []any{&idx, &kind, &k.Entries, &k.Quantity, &k.Delta.Available, &k.Delta.Reserved, &k.Delta.Sold}, func() error {
		s, err := sn.shard(idx)
		if err == nil {
			s.Kinds[stock.OpKind(kind)] = k
		}
		return err
	}, `SELECT shard, kind, count(*), sum(quantity), sum(available_after - available_before),
		sum(reserved_after - reserved_before), sum(sold_after - sold_before) FROM ledger WHERE sku = $1 GROUP BY shard, kind`)
}

// chains counts, per shard, the entries that do not start where the
// shard's previous one ended (the first where the shard opened).
func (sn *snapshot) chains(ctx context.Context) error {
	var idx int32
	var n int64
	return sn.each(ctx, []any{&idx, &n}, func() error {
		s, err := sn.shard(idx)
		if err == nil {
			s.BrokenChain = n
		}
		return err
	}, `SELECT l.shard, count(*) FROM (
		SELECT shard, id, available_before, reserved_before, sold_before,
			lag(available_after) OVER w AS pa, lag(reserved_after) OVER w AS pr, lag(sold_after) OVER w AS ps
		FROM ledger WHERE sku = $1 WINDOW w AS (PARTITION BY shard ORDER BY id)) l
		JOIN shards s ON s.sku = $1 AND s.idx = l.shard
		WHERE (coalesce(l.pa, s.opening_available), coalesce(l.pr, 0), coalesce(l.ps, 0))
			IS DISTINCT FROM (l.available_before, l.reserved_before, l.sold_before)
		GROUP BY l.shard`)
}

// held sums the held reservations of each shard.
func (sn *snapshot) held(ctx context.Context) error {
	var idx int32
	var n int64
	return sn.each(ctx, []any{&idx, &n}, func() error {
		s, err := sn.shard(idx)
		if err == nil {
			s.HeldReserved = n
		}
		return err
	}, `SELECT shard, sum(quantity) FROM reservations WHERE sku = $1 AND state = 'held' GROUP BY shard`)
}

// keyed lists the operations and keyed ledger entries that do not pair
// one to one.
func (sn *snapshot) keyed(ctx context.Context) error {
	var m ledger.KeyMismatch
	return sn.each(ctx, []any{&m.Key, &m.Operations, &m.Entries}, func() error {
		sn.snap.KeyedMismatches = append(sn.snap.KeyedMismatches, m)
		return nil
	}, `WITH o AS (SELECT idempotency_key AS k, kind FROM operations WHERE sku = $1),
		l AS (SELECT idempotency_key AS k, kind, count(*) AS n FROM ledger
			WHERE sku = $1 AND kind IN ('reserve', 'deduct', 'replenish', 'adjust') GROUP BY 1, 2)
		SELECT coalesce(o.k, l.k), (o.k IS NOT NULL)::int::int8, coalesce(l.n, 0)
		FROM o FULL JOIN l ON o.k = l.k AND o.kind = l.kind
		WHERE o.k IS NULL OR l.k IS NULL OR l.n <> 1 LIMIT $2`, mismatchesMax)
}

// ends lists the reservations whose end entries are wrong: every ended
// one has exactly one, of its kind; a held one none.
func (sn *snapshot) ends(ctx context.Context) error {
	var e ledger.EndMismatch
	var state string
	return sn.each(ctx, []any{&e.ReservationID, &state, &e.Entries}, func() error {
		e.State = stock.ReservationState(state)
		sn.snap.EndMismatches = append(sn.snap.EndMismatches, e)
		return nil
	}, `WITH e AS (SELECT reservation_id AS id, kind, count(*) AS n FROM ledger
			WHERE sku = $1 AND kind IN ('commit', 'release', 'expire') GROUP BY 1, 2),
		t AS (SELECT r.id, r.state,
			coalesce(sum(e.n) FILTER (WHERE e.kind = CASE r.state WHEN 'committed' THEN 'commit'
				WHEN 'released' THEN 'release' WHEN 'expired' THEN 'expire' END), 0) AS right_n,
			coalesce(sum(e.n), 0) AS all_n
			FROM reservations r LEFT JOIN e ON e.id = r.id WHERE r.sku = $1 GROUP BY r.id, r.state)
		SELECT id, state, all_n::int8 FROM t
		WHERE all_n <> right_n OR right_n <> CASE WHEN state = 'held' THEN 0 ELSE 1 END LIMIT $2`, mismatchesMax)
}

// transfers lists the transfers whose steps in the ledger are not the ones
// their state says happened, once each.
func (sn *snapshot) transfers(ctx context.Context) error {
	var tm ledger.TransferMismatch
	var state string
	return sn.each(ctx, []any{&tm.TransferID, &state, &tm.Outs, &tm.Ins}, func() error {
		tm.State = stock.TransferState(state)
		sn.snap.TransferMismatches = append(sn.snap.TransferMismatches, tm)
		return nil
	}, `WITH e AS (SELECT transfer_id AS id,
			count(*) FILTER (WHERE kind = 'transfer_out') AS outs, count(*) FILTER (WHERE kind = 'transfer_in') AS ins
			FROM ledger WHERE sku = $1 AND transfer_id <> '' GROUP BY 1)
		SELECT coalesce(t.id, e.id), coalesce(t.state, ''), coalesce(e.outs, 0), coalesce(e.ins, 0) FROM transfers t FULL JOIN e ON e.id = t.id
		WHERE (t.sku = $1 OR t.id IS NULL) AND (coalesce(e.outs, 0), coalesce(e.ins, 0)) IS DISTINCT FROM
			(CASE WHEN t.state IN ('debited', 'credited') THEN 1 ELSE 0 END, CASE WHEN t.state = 'credited' THEN 1 ELSE 0 END)
		LIMIT $2`, mismatchesMax)
}

// inTransit sums the stock debited and not yet credited.
func (sn *snapshot) inTransit(ctx context.Context) error {
	return sn.tx.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM transfers WHERE sku = $1 AND state = 'debited'`, sn.sku).Scan(&sn.snap.InTransit)
}

// ledgerPageMax bounds a ListLedger page.
const ledgerPageMax = 1000

// ListLedger returns up to limit entries of a SKU with id > after, oldest
// first.
func (db *DB) ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	limit = min(max(limit, 1), ledgerPageMax)
	rows, err := db.pool.Query(ctx, `SELECT id, sku, shard, kind, quantity, available_before, available_after,
		reserved_before, reserved_after, sold_before, sold_after, idempotency_key, reservation_id, transfer_id,
		order_ref, source, reason, approver, server_id, epoch, created_at
		FROM ledger WHERE sku = $1 AND id > $2 ORDER BY id LIMIT $3`, sku, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.LedgerEntry, error) {
		var e stock.LedgerEntry
		var kind string
		err := r.Scan(&e.ID, &e.Shard.SKU, &e.Shard.Index, &kind, &e.Quantity, &e.Before.Available, &e.After.Available,
			&e.Before.Reserved, &e.After.Reserved, &e.Before.Sold, &e.After.Sold, &e.IdempotencyKey, &e.ReservationID,
			&e.TransferID, &e.OrderRef, &e.Source, &e.Reason, &e.Approver, &e.ServerID, &e.Epoch, &e.CreatedAt)
		e.Kind = stock.OpKind(kind)
		return &e, err
	})
}
