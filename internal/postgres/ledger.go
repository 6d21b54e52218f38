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
// shard rows and their latest checkpoints, then one step per check, each
// reading its own query. The ledger is read from each shard's checkpoint
// on (tailSQL): fewer than ledger.CheckpointEntries entries and one batch's
// per shard, however long the ledger.
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

// shards reads the SKU's shard rows, their latest checkpoints and any
// stretch of theirs a walk found wrong; none is SKU_NOT_FOUND.
func (sn *snapshot) shards(ctx context.Context) error {
	rows, err := sn.tx.Query(ctx, `SELECT s.idx, s.available, s.reserved, s.sold, s.opening_available,
			c.entry_id, coalesce(c.available, 0), coalesce(c.reserved, 0), coalesce(c.sold, 0), coalesce(c.received, 0),
			coalesce(w.unsound_to, 0), coalesce(w.unsound, '')
		FROM shards s LEFT JOIN LATERAL (`+sqlLatestCheckpoint+`) c ON true
		LEFT JOIN ledger_walks w ON w.sku = s.sku AND w.shard = s.idx
		WHERE s.sku = $1 ORDER BY s.idx`, sn.sku)
	if err != nil {
		return err
	}
	sn.snap.Shards, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledger.Shard, error) {
		s := ledger.Shard{Kinds: map[stock.OpKind]ledger.KindSum{}}
		var cp ledger.Checkpoint
		var entryID *int64
		var unsound ledger.Unsound
		err := r.Scan(&s.Index, &s.Row.Available, &s.Row.Reserved, &s.Row.Sold, &s.Opening.Available,
			&entryID, &cp.Counts.Available, &cp.Counts.Reserved, &cp.Counts.Sold, &cp.Received, &unsound.To, &unsound.Detail)
		if entryID != nil {
			cp.EntryID = *entryID
			s.Checkpoint = &cp
		}
		if unsound.To != 0 {
			s.Unsound = &unsound
		}
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

// sqlLatestCheckpoint is the latest checkpoint of shard s (a LATERAL
// subquery): one row read from the end of its key.
const sqlLatestCheckpoint = `SELECT entry_id, available, reserved, sold, received, group_seq, created_at FROM ledger_checkpoints
	WHERE sku = s.sku AND shard = s.idx ORDER BY entry_id DESC LIMIT 1`

// sqlTail starts a query of a SKU's ($1) entries after each shard's
// latest checkpoint: cp is each shard's start (its checkpoint, or its
// opening balance: entry 0, before every write group), tail the entries
// after it, each shard's read from the end of ledger_shard. OFFSET 0 keeps
// each shard's read a subquery of its own, run once per shard with its
// checkpoint's id: flattened, the planner does not know how far that id
// is, and scans the SKU's whole ledger for it.
const sqlTail = `WITH cp AS (SELECT s.idx AS shard, coalesce(c.entry_id, 0) AS entry_id,
		coalesce(c.group_seq, -1) AS group_seq, coalesce(c.created_at, '-infinity') AS created_at,
		coalesce(c.available, s.opening_available) AS available,
		coalesce(c.reserved, 0) AS reserved, coalesce(c.sold, 0) AS sold
		FROM shards s LEFT JOIN LATERAL (` + sqlLatestCheckpoint + `) c ON true WHERE s.sku = $1),
	tail AS (SELECT l.* FROM cp CROSS JOIN LATERAL (SELECT * FROM ledger l
		WHERE l.sku = $1 AND l.shard = cp.shard AND l.id > cp.entry_id OFFSET 0) l)
	`

// kindSums reads the sums of the entries after each shard's checkpoint,
// by shard and kind.
func (sn *snapshot) kindSums(ctx context.Context) error { return sn.kindSumsOf(ctx, sqlTail) }

// kindSumsOf reads the sums of the entries of tail, by shard and kind:
// from starts a query with the WITH queries cp and tail (sqlTail,
// sqlStretch) of args.
func (sn *snapshot) kindSumsOf(ctx context.Context, from string, args ...any) error {
	var idx int32
	var kind string
	var k ledger.KindSum
	return sn.each(ctx, []any{&idx, &kind, &k.Entries, &k.Quantity, &k.Delta.Available, &k.Delta.Reserved, &k.Delta.Sold}, func() error {
		s, err := sn.shard(idx)
		if err == nil {
			s.Kinds[stock.OpKind(kind)] = k
		}
		return err
	}, from+`SELECT shard, kind, count(*), sum(quantity), sum(available_after - available_before),
		sum(reserved_after - reserved_before), sum(sold_after - sold_before) FROM tail GROUP BY shard, kind`, args...)
}

// chains counts, per shard, the entries after its checkpoint that do not
// start where the shard's previous one ended (the first where the
// checkpoint, or the shard's opening, left it).
func (sn *snapshot) chains(ctx context.Context) error { return sn.chainsOf(ctx, sqlTail) }

// chainsOf counts, per shard, the entries of tail that do not start where
// the previous one ended (the first where cp left it); from as kindSumsOf.
func (sn *snapshot) chainsOf(ctx context.Context, from string, args ...any) error {
	var idx int32
	var n int64
	return sn.each(ctx, []any{&idx, &n}, func() error {
		s, err := sn.shard(idx)
		if err == nil {
			s.BrokenChain = n
		}
		return err
	}, from+`SELECT l.shard, count(*) FROM (
		SELECT shard, id, available_before, reserved_before, sold_before,
			lag(available_after) OVER w AS pa, lag(reserved_after) OVER w AS pr, lag(sold_after) OVER w AS ps
		FROM tail WINDOW w AS (PARTITION BY shard ORDER BY id)) l
		JOIN cp ON cp.shard = l.shard
		WHERE (coalesce(l.pa, cp.available), coalesce(l.pr, cp.reserved), coalesce(l.ps, cp.sold))
			IS DISTINCT FROM (l.available_before, l.reserved_before, l.sold_before)
		GROUP BY l.shard`, args...)
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

// keyed lists the operations and keyed ledger entries after the
// checkpoints that do not pair one to one: every keyed entry after its
// shard's checkpoint is paired by its key, and so is every operation of a
// later write group than the checkpoint's (an operation and its entry are
// written by one group; groupedPart numbers the groups). No clock is
// read: an operation's created_at may be its process's.
func (sn *snapshot) keyed(ctx context.Context) error {
	var m ledger.KeyMismatch
	return sn.each(ctx, []any{&m.Key, &m.Operations, &m.Entries}, func() error {
		sn.snap.KeyedMismatches = append(sn.snap.KeyedMismatches, m)
		return nil
	}, sqlTail+`, l AS (SELECT idempotency_key AS k, kind, count(*) AS n FROM tail
			WHERE kind IN ('reserve', 'deduct', 'replenish', 'adjust', 'refund') GROUP BY 1, 2),
		o AS (SELECT idempotency_key AS k, kind FROM operations WHERE sku = $1 AND idempotency_key IN (SELECT k FROM l)
			UNION SELECT o.idempotency_key, o.kind FROM cp CROSS JOIN LATERAL (SELECT idempotency_key, kind FROM operations o
				WHERE o.sku = $1 AND o.shard = cp.shard AND o.group_seq > cp.group_seq OFFSET 0) o)
		SELECT coalesce(o.k, l.k), (o.k IS NOT NULL)::int::int8, coalesce(l.n, 0)
		FROM o FULL JOIN l ON o.k = l.k AND o.kind = l.kind
		WHERE o.k IS NULL OR l.k IS NULL OR l.n <> 1 LIMIT $2`, mismatchesMax)
}

// ends lists the reservations whose end entries are wrong: every ended
// one has exactly one, of its kind; a held one none. It reads the end
// entries after the checkpoints, and the reservations they end or that
// were ended by a later write group than their shard's checkpoint's (an
// end and its entry are written by one group; reservations_ended finds
// those). An end that no group wrote (end_group_seq 0: before migration
// 00011, or by hand) is after the checkpoint if the database's clock
// dates it so (reservations_ended_ungrouped; the service's ends never
// enter that index).
func (sn *snapshot) ends(ctx context.Context) error {
	var e ledger.EndMismatch
	var state string
	return sn.each(ctx, []any{&e.ReservationID, &state, &e.Entries}, func() error {
		e.State = stock.ReservationState(state)
		sn.snap.EndMismatches = append(sn.snap.EndMismatches, e)
		return nil
	}, sqlTail+`, e AS (SELECT reservation_id AS id, kind, count(*) AS n FROM tail
			WHERE kind IN ('commit', 'release', 'expire') GROUP BY 1, 2),
		r AS (SELECT id, state, committed < quantity AS partial FROM reservations WHERE sku = $1 AND id IN (SELECT id FROM e)
			UNION SELECT r.id, r.state, r.partial FROM cp CROSS JOIN LATERAL (SELECT id, state, committed < quantity AS partial FROM reservations r
				WHERE r.sku = $1 AND r.shard = cp.shard AND r.state <> 'held' AND r.end_group_seq > cp.group_seq OFFSET 0) r
			UNION SELECT r.id, r.state, r.partial FROM cp CROSS JOIN LATERAL (SELECT id, state, committed < quantity AS partial FROM reservations r
				WHERE r.sku = $1 AND r.shard = cp.shard AND r.state <> 'held' AND r.end_group_seq = 0
					AND r.ended_at > cp.created_at OFFSET 0) r),
		t AS (SELECT r.id, r.state, coalesce(r.partial, false) AS partial,
			coalesce(sum(e.n) FILTER (WHERE e.kind = CASE r.state WHEN 'committed' THEN 'commit'
				WHEN 'released' THEN 'release' WHEN 'expired' THEN 'expire' END), 0) AS right_n,
			coalesce(sum(e.n) FILTER (WHERE e.kind = 'release' AND r.state = 'committed'), 0) AS rest_n,
			coalesce(sum(e.n), 0) AS all_n
			FROM r LEFT JOIN e ON e.id = r.id GROUP BY r.id, r.state, r.partial)
		SELECT id, state, all_n::int8 FROM t
		WHERE all_n <> right_n + rest_n OR right_n <> CASE WHEN state = 'held' THEN 0 ELSE 1 END
			OR rest_n <> CASE WHEN partial THEN 1 ELSE 0 END LIMIT $2`, mismatchesMax)
}

// transfers lists the transfers whose steps in the ledger are not the ones
// their state says happened, once each. A transfer's steps may be on
// either side of a checkpoint: they are read, whenever they were, through
// ledger_transfers, which holds transfer entries only.
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

// ListLedger returns up to limit entries of a SKU with id > after, oldest
// first.
func (db *DB) ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	limit = min(max(limit, 1), ledger.PageMax)
	rows, err := db.pool.Query(ctx, `SELECT `+sqlEntryColumns+`
		FROM ledger WHERE sku = $1 AND id > $2 ORDER BY id LIMIT $3`, sku, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.LedgerEntry, error) {
		var e stock.LedgerEntry
		return &e, scanEntry(r, &e)
	})
}

// sqlEntryColumns are the columns scanEntry reads, in its order.
const sqlEntryColumns = `id, sku, shard, kind, quantity, available_before, available_after,
	reserved_before, reserved_after, sold_before, sold_after, idempotency_key, reservation_id, transfer_id,
	order_ref, source, reason, approver, server_id, epoch, created_at, caller, original`

// scanEntry scans sqlEntryColumns, after any columns before them (dest).
func scanEntry(r pgx.CollectableRow, e *stock.LedgerEntry, dest ...any) error {
	var kind, original string
	err := r.Scan(append(dest, &e.ID, &e.Shard.SKU, &e.Shard.Index, &kind, &e.Quantity, &e.Before.Available, &e.After.Available,
		&e.Before.Reserved, &e.After.Reserved, &e.Before.Sold, &e.After.Sold, &e.IdempotencyKey, &e.ReservationID,
		&e.TransferID, &e.OrderRef, &e.Source, &e.Reason, &e.Approver, &e.ServerID, &e.Epoch, &e.CreatedAt, &e.Caller, &original)...)
	e.Kind = stock.OpKind(kind)
	e.Original = stock.ParseSale(original)
	return err
}
