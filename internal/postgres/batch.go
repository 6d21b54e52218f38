package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardstock/shardstock/internal/stock"
)

// Errors of a batch transaction. Every one but ErrOutcomeUnknown means the
// batch wrote nothing.
var (
	// ErrFenced: the partition's epoch in the database is not the writer's:
	// another server took the partition over.
	ErrFenced = errors.New("postgres: fenced: partition owned at another epoch")
	// ErrConflict: another shard's batch took a key or a customer's quota
	// concurrently; rerun the batch (the lookups will see it).
	ErrConflict = errors.New("postgres: conflict with a concurrent batch")
	// ErrDiverged: the shard row is not what the writer's memory says: an
	// invariant violation (a second writer).
	ErrDiverged = errors.New("postgres: shard row diverged from the writer's copy")
	// ErrNotCommitted: the transaction failed before or at commit and is
	// known not to have committed.
	ErrNotCommitted = errors.New("postgres: batch not committed")
	// ErrOutcomeUnknown: the commit's outcome could not be learnt.
	ErrOutcomeUnknown = errors.New("postgres: batch commit outcome unknown")
)

// Fence identifies a writer: the partition it writes, the epoch it owns it
// at, and its server.
type Fence struct {
	Partition int32
	Epoch     int64
	ServerID  string
}

// BatchQuery says what a batch must read before it decides.
type BatchQuery struct {
	Shard          stock.ShardKey
	Keys           []string // idempotency keys of keyed requests
	ReservationIDs []string // reservations committed or released
	Customers      []string // customer refs of reserves and deducts
	SweepMax       int      // >0: also read up to this many due holds
	TransferIDs    []string // transfers stepped
}

// BatchRead is what the batch read, inside its transaction.
type BatchRead struct {
	SKU          *stock.SKU // nil: no such SKU
	Ops          map[string]*stock.Operation
	Reservations map[string]*stock.Reservation
	Due          []*stock.Reservation // held and expired, for the sweep
	Usage        map[string]int64     // customer ref -> units held or bought
	Transfers    map[string]*stock.Transfer
	Now          time.Time // the database clock
}

// BatchWrite is what the batch decided to write.
type BatchWrite struct {
	Ops             []*stock.Operation
	NewReservations []*stock.Reservation
	Ended           []ReservationEnd
	UsageAdd        map[string]int64 // customer -> units (guarded by Limit)
	UsageSub        map[string]int64 // customer -> units given back
	UsageLimit      int64
	Ledger          []*stock.LedgerEntry
	Steps           []TransferStep
	From, To        stock.Counts
}

// TransferStep moves one transfer from one state to the next.
type TransferStep struct {
	ID       string
	From, To stock.TransferState
}

// ReservationEnd ends one held reservation.
type ReservationEnd struct {
	ID     string
	State  stock.ReservationState
	Reason string
}

// Empty reports whether the write changes nothing.
func (w *BatchWrite) Empty() bool {
	return len(w.Ops) == 0 && len(w.NewReservations) == 0 && len(w.Ended) == 0 && len(w.Ledger) == 0 &&
		len(w.Steps) == 0 && len(w.UsageAdd) == 0 && len(w.UsageSub) == 0 && w.From == w.To
}

// Decide turns what a batch read into what it writes. It runs inside the
// transaction and must be pure: it may run again on a retry.
type Decide func(*BatchRead) (*BatchWrite, error)

// Batch runs one batch transaction for one shard in two round trips: BEGIN
// with every read (fence check, lookups), then decide in memory, then every
// write with COMMIT. It returns nil only when the batch committed (or had
// nothing to write).
func (db *DB) Batch(ctx context.Context, f Fence, q BatchQuery, decide Decide) (err error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: acquire: %v", ErrNotCommitted, err)
	}
	defer func() {
		// A transaction left open (refused, failed or empty) is rolled
		// back; a broken connection is dropped by the pool on release.
		if st := conn.Conn().PgConn().TxStatus(); st != 'I' && !conn.Conn().IsClosed() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				conn.Conn().Close(rctx)
			}
			cancel()
		}
		conn.Release()
	}()

	read, xid, err := readBatch(ctx, conn.Conn(), f, q)
	if err != nil {
		return err
	}
	w, err := decide(read)
	if err != nil {
		return err
	}
	if w.Empty() {
		return nil // nothing to write: the deferred rollback ends it
	}
	committing, err := writeBatch(ctx, conn.Conn(), f, q.Shard, w)
	if err != nil && committing {
		return db.commitOutcome(ctx, xid, conn.Conn().PgConn().PID(), err)
	}
	return err
}

// readBatch is the batch's first round trip: BEGIN; the fence (FOR SHARE, so
// that a takeover waits for this batch and a batch after the takeover sees
// the new epoch); the transaction id (to learn the outcome of a lost commit);
// the SKU; the existing operations, reservations and customer usage.
func readBatch(ctx context.Context, conn *pgx.Conn, f Fence, q BatchQuery) (*BatchRead, string, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT owner, epoch, pg_current_xact_id()::text, now() FROM partitions WHERE partition = $1 FOR SHARE`, f.Partition)
	b.Queue(sqlSelectSKU, q.Shard.SKU)
	if len(q.Keys) > 0 {
		b.Queue(sqlSelectOps, q.Keys)
	}
	if len(q.ReservationIDs) > 0 {
		b.Queue(sqlSelectReservationsByID, q.ReservationIDs)
	}
	if q.SweepMax > 0 {
		b.Queue(sqlSelectReservations+` WHERE sku = $1 AND shard = $2 AND state = 'held' AND expires_at <= now() ORDER BY expires_at LIMIT $3`,
			q.Shard.SKU, q.Shard.Index, q.SweepMax)
	}
	if len(q.TransferIDs) > 0 {
		b.Queue(`SELECT t.* FROM unnest($1::text[]) AS k(id) CROSS JOIN LATERAL (`+sqlSelectTransfers+` WHERE id = k.id) t`, q.TransferIDs)
	}
	if len(q.Customers) > 0 {
		b.Queue(`SELECT u.customer_ref, u.quantity FROM unnest($2::text[]) AS k(c)
			CROSS JOIN LATERAL (SELECT customer_ref, quantity FROM customer_usage WHERE sku = $1 AND customer_ref = k.c) u`, q.Shard.SKU, q.Customers)
	}
	res := conn.SendBatch(ctx, b)
	defer res.Close()

	read := &BatchRead{Ops: map[string]*stock.Operation{}, Reservations: map[string]*stock.Reservation{},
		Usage: map[string]int64{}, Transfers: map[string]*stock.Transfer{}}
	if _, err := res.Exec(); err != nil {
		return nil, "", notCommitted("begin", err)
	}
	var owner, xid string
	var epoch int64
	if err := res.QueryRow().Scan(&owner, &epoch, &xid, &read.Now); err != nil {
		return nil, "", notCommitted("fence", err)
	}
	if owner != f.ServerID || epoch != f.Epoch {
		return nil, "", fmt.Errorf("%w: partition %d is %s@%d, writer is %s@%d", ErrFenced, f.Partition, owner, epoch, f.ServerID, f.Epoch)
	}
	sku, err := scanSKU(res.QueryRow())
	if err != nil && !isNoRows(err) {
		return nil, "", notCommitted("sku", err)
	}
	read.SKU = sku
	if len(q.Keys) > 0 {
		if err := scanOps(res, read.Ops); err != nil {
			return nil, "", notCommitted("operations", err)
		}
	}
	if len(q.ReservationIDs) > 0 {
		rs, err := scanReservations(res)
		if err != nil {
			return nil, "", notCommitted("reservations", err)
		}
		for _, r := range rs {
			read.Reservations[r.ID] = r
		}
	}
	if q.SweepMax > 0 {
		if read.Due, err = scanReservations(res); err != nil {
			return nil, "", notCommitted("due reservations", err)
		}
	}
	if len(q.TransferIDs) > 0 {
		ts, err := scanTransfers(res)
		if err != nil {
			return nil, "", notCommitted("transfers", err)
		}
		for _, t := range ts {
			read.Transfers[t.ID] = t
		}
	}
	if len(q.Customers) > 0 {
		rows, err := res.Query()
		if err != nil {
			return nil, "", notCommitted("usage", err)
		}
		var c string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&c, &n}, func() error { read.Usage[c] = n; return nil })
		if err != nil {
			return nil, "", notCommitted("usage", err)
		}
	}
	if err := res.Close(); err != nil {
		return nil, "", notCommitted("read", err)
	}
	return read, xid, nil
}

// Error codes raised by shardstock_expect inside a write statement.
const (
	sqlstateConflict = "SS001"
	sqlstateDiverged = "SS002"
	sqlstateUnique   = "23505"
)

// writeBatch is the batch's second round trip, ending in COMMIT. Operations
// are inserted with ON CONFLICT DO NOTHING in key order (so two batches never
// deadlock on the unique index); a key that conflicts was taken by another
// shard meanwhile, and the statement's own row count check aborts the
// transaction, so that the batch is rerun (the rerun's lookup then sees the
// key as a replay) rather than counted a success. The shard row is updated
// once, compare-and-set against the writer's copy.
//
// committing is true when the error may have come from the COMMIT itself,
// whose outcome must then be learnt.
func writeBatch(ctx context.Context, conn *pgx.Conn, f Fence, shard stock.ShardKey, w *BatchWrite) (committing bool, err error) {
	b := &pgx.Batch{}
	ops := slices.Clone(w.Ops)
	slices.SortFunc(ops, func(a, b *stock.Operation) int { return compareStrings(a.IdempotencyKey, b.IdempotencyKey) })
	if len(ops) > 0 {
		queueInsertOps(b, ops)
	}
	// Give units back before taking more, as the planner counted them.
	if len(w.UsageSub) > 0 {
		queueUsageSub(b, shard.SKU, w.UsageSub)
	}
	if len(w.UsageAdd) > 0 {
		queueUsageAdd(b, shard.SKU, w.UsageAdd, w.UsageLimit)
	}
	if len(w.NewReservations) > 0 {
		queueInsertReservations(b, w.NewReservations)
	}
	if len(w.Ended) > 0 {
		queueEndReservations(b, w.Ended)
	}
	if len(w.Steps) > 0 {
		queueStepTransfers(b, w.Steps)
	}
	if w.From != w.To {
		b.Queue(`WITH u AS (UPDATE shards SET available = $3, reserved = $4, sold = $5, updated_at = now()
			WHERE sku = $1 AND idx = $2 AND available = $6 AND reserved = $7 AND sold = $8 RETURNING 1)
			SELECT shardstock_expect(count(*), 1, 'shard row', 'SS002') FROM u`,
			shard.SKU, shard.Index, w.To.Available, w.To.Reserved, w.To.Sold, w.From.Available, w.From.Reserved, w.From.Sold)
	}
	if len(w.Ledger) > 0 {
		queueInsertLedger(b, f, w.Ledger)
	}
	b.Queue("COMMIT")
	res := conn.SendBatch(ctx, b)
	defer res.Close()

	for i := 0; i < b.Len()-1; i++ {
		if _, err := res.Exec(); err != nil {
			// The server answering an error before COMMIT aborts the
			// transaction. Anything else (the connection lost) leaves the
			// COMMIT sent behind it in doubt: its outcome must be learnt.
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return true, err
			}
			return false, classify(err, shard)
		}
	}
	if _, err := res.Exec(); err != nil {
		return true, err
	}
	if err := res.Close(); err != nil {
		return true, err
	}
	// A COMMIT in a failed transaction answers ROLLBACK without an error.
	if st := conn.PgConn().TxStatus(); st != 'I' {
		return false, fmt.Errorf("%w: transaction still open after COMMIT (%c)", ErrNotCommitted, st)
	}
	return false, nil
}

// classify maps a write statement's error to a batch error.
func classify(err error, shard stock.ShardKey) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateConflict, sqlstateUnique:
			return fmt.Errorf("%w: %s", ErrConflict, pgErr.Message)
		case sqlstateDiverged:
			return fmt.Errorf("%w: %s: %s", ErrDiverged, shard, pgErr.Message)
		}
	}
	return notCommitted("write", err)
}

// commitOutcome learns whether a transaction whose COMMIT failed committed
// after all, asking the database by transaction id on another connection.
//
// While the transaction is still in progress (its backend has not noticed
// the lost connection, or a network partition hides it) the answer would
// come too late: the writer must know before its next batch. So after the
// first "in progress" the old backend is terminated, which forces an end:
// aborted, unless the commit record was already written.
func (db *DB) commitOutcome(ctx context.Context, xid string, pid uint32, commitErr error) error {
	// An ERROR answer is the server refusing the commit (the transaction
	// rolled back). A FATAL one (the backend was terminated) or a lost
	// connection may have come after the commit record was written: ask.
	var pgErr *pgconn.PgError
	if errors.As(commitErr, &pgErr) && pgErr.Severity == "ERROR" {
		return fmt.Errorf("%w: commit: %v", ErrNotCommitted, commitErr)
	}
	ctx = context.WithoutCancel(ctx)
	for attempt := 0; attempt < outcomeAttemptsMax; attempt++ {
		if attempt > 0 {
			time.Sleep(outcomeBackoff * time.Duration(attempt))
		}
		qctx, cancel := context.WithTimeout(ctx, queryTimeout)
		var status *string
		err := db.pool.QueryRow(qctx, `SELECT pg_xact_status($1::xid8)`, xid).Scan(&status)
		cancel()
		if err != nil || status == nil {
			continue
		}
		switch *status {
		case "committed":
			return nil
		case "aborted":
			return fmt.Errorf("%w: commit lost: %v", ErrNotCommitted, commitErr)
		}
		// "in progress": end the old backend, then ask again.
		if attempt == 0 {
			qctx, cancel := context.WithTimeout(ctx, queryTimeout)
			db.pool.Exec(qctx, `SELECT pg_terminate_backend($1)`, int32(pid))
			cancel()
		}
	}
	return fmt.Errorf("%w: %v", ErrOutcomeUnknown, commitErr)
}

// Bounds on learning a lost commit's outcome.
const (
	outcomeAttemptsMax = 10
	outcomeBackoff     = 50 * time.Millisecond
)

func notCommitted(step string, err error) error {
	return fmt.Errorf("%w: %s: %v", ErrNotCommitted, step, err)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
