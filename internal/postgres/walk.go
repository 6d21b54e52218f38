package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
)

// sqlStretch starts a query of one stretch of a SKU's ($1) shard ($2), as
// sqlTail does of the tails: cp is its start (entry $3, counts $4-$6),
// tail its entries up to entry $7, one range of ledger_shard.
const sqlStretch = `WITH cp AS (SELECT $2::int AS shard, $4::bigint AS available, $5::bigint AS reserved, $6::bigint AS sold),
	tail AS (SELECT * FROM ledger WHERE sku = $1 AND shard = $2 AND id > $3::bigint AND id <= $7::bigint)
	`

// Stretches reads up to limit of the SKU's stretches that no walk has
// checked (after each shard's ledger_walks.walked_to), of the shards with
// none recorded unsound: each shard's oldest first, the shards taking
// turns. Checkpoints and entries are append-only and a shard's entries up
// to a checkpoint committed before it, so a stretch is the same whenever
// it is read: each is read on its own.
func (db *DB) Stretches(ctx context.Context, sku string, limit int) ([]ledger.Stretch, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if limit <= 0 {
		return nil, nil
	}
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	byShard, err := unwalked(ctx, tx, sku, limit)
	if err != nil {
		return nil, err
	}
	var out []ledger.Stretch
	for turn := 0; len(out) < limit; turn++ {
		n := len(out)
		for _, sts := range byShard {
			if turn < len(sts) && len(out) < limit {
				out = append(out, sts[turn])
			}
		}
		if len(out) == n {
			break
		}
	}
	for i := range out {
		if err := readStretch(ctx, tx, sku, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, tx.Commit(ctx)
}

// unwalked lists, per shard in index order, up to limit stretches after
// its walk's record: the checkpoint the record names starts the first
// (none: the shard's opening balance), and each next checkpoint ends one.
func unwalked(ctx context.Context, tx pgx.Tx, sku string, limit int) ([][]ledger.Stretch, error) {
	rows, err := tx.Query(ctx, `SELECT s.idx, s.opening_available, coalesce(w.walked_to, 0),
			c.entry_id, c.available, c.reserved, c.sold, c.received
		FROM shards s LEFT JOIN ledger_walks w ON w.sku = s.sku AND w.shard = s.idx
		CROSS JOIN LATERAL (SELECT * FROM ledger_checkpoints c WHERE c.sku = s.sku AND c.shard = s.idx
			AND c.entry_id >= coalesce(w.walked_to, 0) ORDER BY c.entry_id LIMIT $2 + 1) c
		WHERE s.sku = $1 AND coalesce(w.unsound_to, 0) = 0
		ORDER BY s.idx, c.entry_id`, sku, limit)
	if err != nil {
		return nil, err
	}
	var out [][]ledger.Stretch
	var idx, last int32 = 0, -1
	var opening, walkedTo int64
	var from *ledger.Checkpoint
	var cp ledger.Checkpoint
	_, err = pgx.ForEachRow(rows, []any{&idx, &opening, &walkedTo, &cp.EntryID, &cp.Counts.Available, &cp.Counts.Reserved, &cp.Counts.Sold, &cp.Received}, func() error {
		if idx != last {
			last, from = idx, nil
			out = append(out, nil)
		}
		if cp.EntryID == walkedTo { // the start of the first stretch
			start := cp
			from = &start
			return nil
		}
		if from == nil && walkedTo != 0 {
			return stock.Errorf(stock.CodeInternal, "%s shard %d: no checkpoint at entry %d, where its walk stopped", sku, idx, walkedTo)
		}
		out[len(out)-1] = append(out[len(out)-1], ledger.Stretch{Index: idx, Opening: stock.Counts{Available: opening}, From: from, To: cp})
		to := cp
		from = &to
		return nil
	})
	return out, err
}

// readStretch reads what CheckStretch needs of st's entries.
func readStretch(ctx context.Context, tx pgx.Tx, sku string, st *ledger.Stretch) error {
	start := st.Opening
	var fromID int64
	if st.From != nil {
		start, fromID = st.From.Counts, st.From.EntryID
	}
	sh := &ledger.Shard{Index: st.Index, Kinds: map[stock.OpKind]ledger.KindSum{}}
	sn := &snapshot{tx: tx, sku: sku, byIndex: map[int32]*ledger.Shard{st.Index: sh}}
	args := []any{st.Index, fromID, start.Available, start.Reserved, start.Sold, st.To.EntryID}
	if err := sn.kindSumsOf(ctx, sqlStretch, args...); err != nil {
		return err
	}
	if err := sn.chainsOf(ctx, sqlStretch, args...); err != nil {
		return err
	}
	st.Kinds, st.BrokenChain = sh.Kinds, sh.BrokenChain
	return nil
}

// Walked records how far a walk got on one of the SKU's shards: walked_to
// never moves back (a pass that lost its lease may finish late), and the
// first stretch recorded unsound stays recorded until an operator deletes
// the row.
func (db *DB) Walked(ctx context.Context, sku string, w ledger.Walk) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var unsound ledger.Unsound
	if w.Unsound != nil {
		unsound = *w.Unsound
	}
	_, err := db.pool.Exec(ctx, `INSERT INTO ledger_walks AS w (sku, shard, walked_to, unsound_to, unsound) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (sku, shard) DO UPDATE SET walked_to = greatest(w.walked_to, excluded.walked_to),
			unsound_to = CASE WHEN w.unsound_to <> 0 THEN w.unsound_to ELSE excluded.unsound_to END,
			unsound = CASE WHEN w.unsound_to <> 0 THEN w.unsound ELSE excluded.unsound END, updated_at = now()`,
		sku, w.Shard, w.To, unsound.To, unsound.Detail)
	return err
}
