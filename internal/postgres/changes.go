package postgres

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/ledger"
)

// The ledger in commit order (internal/ledger.Stream; migration 00015).
//
// Every statement reads in a snapshot of its own, and pg_current_snapshot()
// is that snapshot: its xmin is the oldest transaction still running when
// the statement began (in any database of the cluster). Every transaction
// below it has ended, and a new one takes a larger id, so the entries with
// xid < xmin that the statement sees are all there will ever be below it:
// a reader that keeps the last (xid, id) it delivered and reads above it
// misses nothing, whatever order transactions commit in. The positions a
// reader keeps name only committed entries, so they stay valid after a
// crash, where Postgres hands out again the ids that never reached its WAL:
// those are all above every committed one.

// sqlHorizon is the reading statement's xmin, as an xid8.
const sqlHorizon = `pg_snapshot_xmin(pg_current_snapshot())`

// Changes returns up to limit ledger entries after pos, in (xid, id)
// order, of transactions that had ended when the read began.
func (db *DB) Changes(ctx context.Context, after ledger.Position, limit int) ([]ledger.Change, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	limit = min(max(limit, 1), ledger.PageMax)
	// The row comparison is one range of ledger_commit_order.
	rows, err := db.pool.Query(ctx, `SELECT xid::text::int8, `+sqlEntryColumns+` FROM ledger
		WHERE (xid, id) > ($1::text::xid8, $2) AND xid < `+sqlHorizon+`
		ORDER BY xid, id LIMIT $3`, strconv.FormatUint(after.XID, 10), after.ID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledger.Change, error) {
		var c ledger.Change
		var xid int64
		err := scanEntry(r, &c.Entry, &xid)
		c.Pos = ledger.Position{XID: uint64(xid), ID: c.Entry.ID}
		return c, err
	})
}

// Head returns the position of the newest entry a reader may take now
// (the zero Position if none), and the next transaction id the database
// will hand out: no position of this database can reach it. The ORDER BY
// names the table's columns, not the casts of the same names, so that it
// reads one entry from the end of ledger_commit_order instead of sorting
// the ledger.
func (db *DB) Head(ctx context.Context) (head ledger.Position, next uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var xid, id, nxt int64
	err = db.pool.QueryRow(ctx, `SELECT coalesce(h.xid, 0), coalesce(h.id, 0), pg_snapshot_xmax(pg_current_snapshot())::text::int8
		FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT l.xid::text::int8 AS xid, l.id FROM ledger l WHERE l.xid < `+sqlHorizon+`
			ORDER BY l.xid DESC, l.id DESC LIMIT 1) h ON true`).Scan(&xid, &id, &nxt)
	return ledger.Position{XID: uint64(xid), ID: id}, uint64(nxt), err
}
