package postgres

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds on learning a lost commit's outcome.
const (
	// outcomeWaitMax bounds how long a writer waits to learn a lost
	// commit's outcome: a database restart (crash recovery included) fits
	// in it. Past it the batch's requests are answered SHARD_UNAVAILABLE
	// (retry with the same key) and the writer reloads its row before its
	// next batch.
	outcomeWaitMax = 15 * time.Second
	// outcomeBackoff is the first pause between attempts; it doubles
	// (give or take 20%) up to outcomeBackoffMax.
	outcomeBackoff    = 50 * time.Millisecond
	outcomeBackoffMax = time.Second
	// outcomeQueryTimeout bounds one attempt (connect, void, read).
	outcomeQueryTimeout = 5 * time.Second
	// blockerGrace is how long a void or a takeover may wait on an old
	// transaction before that transaction's backend is ended: a backend
	// whose client vanished without a FIN, or was stopped, would otherwise
	// hold it until idle_in_transaction_session_timeout (3 s), longer than
	// a short lease.
	blockerGrace = 200 * time.Millisecond
	// markAgeMin is how old a commit mark must be before it is pruned: far
	// longer than outcomeWaitMax, the only time anyone reads it.
	markAgeMin = 10 * time.Minute
	// markPruneMax bounds the marks one prune deletes.
	markPruneMax = 10_000
)

// commitMark identifies one group transaction in commit_marks: the time it
// was made, in milliseconds, then random bits.
type commitMark struct {
	id     [16]byte
	server string
}

func newCommitMark(server string) commitMark {
	return commitMark{id: markID(time.Now()), server: server}
}

// markID returns an id whose first 8 bytes are t in milliseconds
// (big-endian, so the primary key orders marks by age) and whose last 8 are
// random.
func markID(t time.Time) [16]byte {
	var id [16]byte
	binary.BigEndian.PutUint64(id[:8], uint64(t.UnixMilli()))
	rand.Read(id[8:])
	return id
}

func (m commitMark) uuid() pgtype.UUID { return pgtype.UUID{Bytes: m.id, Valid: true} }

func (m commitMark) String() string { return m.uuid().String() }

// markPart inserts the group's commit mark.
func markPart(m commitMark) writePart {
	return writePart{name: "mark", sql: `INSERT INTO commit_marks (id, server_id) VALUES ($1, $2)`, args: []any{m.uuid(), m.server}}
}

// commitOutcome learns whether a group whose COMMIT went unanswered
// committed, from its commit mark, on a new connection: nil if it did,
// stock.ErrNotCommitted if it did not (and now never will), stock.ErrOutcomeUnknown if
// the database did not answer within outcomeWaitMax.
func (db *DB) commitOutcome(ctx context.Context, mark commitMark, commitErr error) error {
	// An ERROR answer is the server refusing the commit (the transaction
	// rolled back). A FATAL one (the backend was terminated) or a lost
	// connection may have come after the commit record was written: ask.
	var pgErr *pgconn.PgError
	if errors.As(commitErr, &pgErr) && pgErr.Severity == "ERROR" {
		return fmt.Errorf("%w: commit: %v", stock.ErrNotCommitted, commitErr)
	}
	// The caller's deadline was for the batch; learning its outcome has
	// its own. Every attempt's failure is worth another (the database is
	// restarting, or the connection was lost again).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), outcomeWaitMax)
	defer cancel()
	exp := &backoff.ExponentialBackOff{InitialInterval: outcomeBackoff, RandomizationFactor: 0.2, Multiplier: 2,
		MaxInterval: outcomeBackoffMax}
	committed, err := backoff.Retry(ctx, func() (bool, error) { return db.settleMark(ctx, mark) },
		backoff.WithBackOff(exp), backoff.WithMaxElapsedTime(outcomeWaitMax))
	switch {
	case err == nil && committed:
		db.lost.committed.Add(1)
		return nil
	case err == nil:
		db.lost.voided.Add(1)
		return fmt.Errorf("%w: commit lost (mark %s voided): %v", stock.ErrNotCommitted, mark, commitErr)
	}
	db.lost.unknown.Add(1)
	return fmt.Errorf("%w: mark %s: %v (last attempt: %v)", stock.ErrOutcomeUnknown, mark, commitErr, err)
}

// settleMark inserts mark's id as a void and reports whether the batch
// committed. The insert waits while the batch's transaction runs (the
// unique index holds its mark); if the batch committed it conflicts and the
// mark reads as not voided; if not, the void commits, and the batch's own
// insert of the mark could only ever conflict with it. A void of an earlier
// attempt, whose answer was lost, reads as voided: not committed.
func (db *DB) settleMark(ctx context.Context, mark commitMark) (committed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, outcomeQueryTimeout)
	defer cancel()
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	tag, err := db.execEndingBlockers(ctx, conn, `INSERT INTO commit_marks (id, server_id, voided) VALUES ($1, $2, true) ON CONFLICT (id) DO NOTHING`,
		mark.uuid(), mark.server)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 1 {
		return false, nil
	}
	// A new statement, so a new snapshot: it sees the row the insert
	// waited for.
	var voided bool
	if err := conn.QueryRow(ctx, `SELECT voided FROM commit_marks WHERE id = $1`, mark.uuid()).Scan(&voided); err != nil {
		return false, err
	}
	if voided {
		return false, nil
	}
	// The batch committed, but a commit is visible before a synchronous
	// standby holds it if its wait for the standby was cut short (its
	// backend ended or cancelled: by an operator, by Postgres shutting
	// down, or by endBlockers in the moment before it began to wait).
	// Answer no one until the database's durability covers it.
	if err := confirmDurable(ctx, conn, mark.server); err != nil {
		return false, err
	}
	return true, nil
}

// confirmDurable commits a write of server's own and returns once the
// database confirmed it as it confirms any commit. Its commit record
// follows in the WAL every commit visible before it began, so with a
// synchronous standby (synchronous_commit on or remote_apply) its COMMIT
// returns only once the standby holds all of them: what was read before it
// is then as durable as an acknowledged sale must be. Without a standby it
// costs one small local commit. With the standby gone it waits, for ctx:
// the caller then knows nothing more, and says so.
func confirmDurable(ctx context.Context, conn *pgxpool.Conn, server string) error {
	_, err := conn.Exec(ctx, `INSERT INTO durability_confirms (server_id) VALUES ($1)
		ON CONFLICT (server_id) DO UPDATE SET confirmed_at = now()`, server)
	if err != nil {
		return fmt.Errorf("postgres: confirm durability: %w", err)
	}
	return nil
}

// execEndingBlockers runs sql on conn and, every blockerGrace while it
// waits for a lock, ends the backends that hold the lock, except those
// that wait for a synchronous standby. The callers wait only on
// transactions that must end anyway: the void of a commit mark on the lost
// batch's own transaction (it alone holds that mark's id), a takeover on
// the previous owner's batches (they hold the partition's row FOR SHARE).
// An ended transaction aborts at once; a commit record already being
// written is not interrupted.
//
// A transaction that waits for a synchronous standby has committed
// locally and holds its locks until the standby has its WAL. Ending its
// backend makes Postgres give the wait up and show the commit to everyone
// ("the transaction has already committed locally, but might not have
// been replicated to the standby"): the void would then read the batch as
// committed and its sales be acknowledged, and a failover to the standby
// would lose them. So such a transaction is left to finish: the void or the
// takeover waits with it, for its deadline, and the batch's outcome stays
// unknown (retry with the same key) until the standby is back or replaced.
func (db *DB) execEndingBlockers(ctx context.Context, conn *pgxpool.Conn, sql string, args ...any) (pgconn.CommandTag, error) {
	waiting := make(chan struct{})
	ended := make(chan struct{})
	go func() { defer close(ended); db.endBlockers(ctx, conn.Conn().PgConn().PID(), waiting) }()
	tag, err := conn.Exec(ctx, sql, args...)
	close(waiting)
	<-ended
	return tag, err
}

// endBlockers ends, every blockerGrace until waiting closes, the backends
// that block backend waiter, but none that waits for a synchronous standby
// (wait event SyncRep; see execEndingBlockers). A backend that begins that
// wait between the read and the signal gives it up: settleMark and
// TakeOver confirm durability after they read what it wrote.
func (db *DB) endBlockers(ctx context.Context, waiter uint32, waiting <-chan struct{}) {
	t := time.NewTicker(blockerGrace)
	defer t.Stop()
	for {
		select {
		case <-waiting:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		db.pool.Exec(ctx, `SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a
			WHERE a.pid = ANY (pg_blocking_pids($1)) AND a.wait_event IS DISTINCT FROM 'SyncRep'`, int32(waiter))
	}
}

// stock.LostCommits returns the counts since Open.
func (db *DB) LostCommits() stock.LostCommits {
	return stock.LostCommits{Committed: db.lost.committed.Load(), Voided: db.lost.voided.Load(), Unknown: db.lost.unknown.Load()}
}

// PruneCommitMarks deletes up to markPruneMax commit marks older than
// markAgeMin (by the id's clock, and by the database's, against a server
// whose clock runs ahead), and returns how many it deleted.
func (db *DB) PruneCommitMarks(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	bound := pgtype.UUID{Bytes: markID(time.Now().Add(-markAgeMin)), Valid: true}
	tag, err := db.pool.Exec(ctx, `DELETE FROM commit_marks WHERE id IN (
		SELECT id FROM commit_marks WHERE id < $1 AND created_at < now() - make_interval(secs => $2) ORDER BY id LIMIT $3)`,
		bound, markAgeMin.Seconds(), markPruneMax)
	if err != nil {
		return 0, fmt.Errorf("postgres: prune commit marks: %w", err)
	}
	return tag.RowsAffected(), nil
}
