package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardstock/shardstock/internal/stock"
)

// Batch runs one shard's batch: a group of one.
func (db *DB) Batch(ctx context.Context, f stock.Fence, q stock.BatchQuery, decide stock.Decide) error {
	u := &stock.Unit{Fence: f, Query: q, Decide: decide}
	if err := db.Group(ctx, []*stock.Unit{u}); err != nil {
		return err
	}
	return u.Err
}

// Group runs the batches of many shards (of this server, each from its own
// writer) in one transaction of two round trips: BEGIN with every read
// (fences, lookups), then each unit decides in memory, then every write with
// COMMIT. The statements are the same whatever the number of units (each
// reads or writes the rows of all units at once), so a group costs Postgres
// about what one batch costs, and concurrent writers share one commit. A
// group that needs no read but its keys' is first tried in one round trip
// (speculate), and runs the usual way only when that attempt wrote nothing.
//
// A unit whose fence fails gets Err = stock.ErrFenced and writes nothing; the
// others go on. Any other failure is the group's: Group returns it and no
// unit committed (stock.ErrConflict, stock.ErrDiverged, stock.ErrNotCommitted, or an error of
// a stock.Decide), except stock.ErrOutcomeUnknown, after which none is known.
func (db *DB) Group(ctx context.Context, units []*stock.Unit) (err error) {
	pc, err := db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: acquire: %v", stock.ErrNotCommitted, err)
	}
	conn := &groupConn{Conn: pc}
	defer conn.release(ctx) // a transaction left open (empty, or failed reading)

	if speculable(units) {
		if done, err := db.speculate(ctx, conn, units); done {
			return err
		}
	}
	// With its reads, a group decides from what it reads: a writer's seed
	// is not that (only a speculative write checks it).
	for _, u := range units {
		if u.Query.Seeded {
			u.Query.LoadShard = true
		}
	}
	reads, err := readGroup(ctx, conn.Conn.Conn(), units)
	if err != nil {
		return err
	}
	for _, r := range reads {
		if r != nil {
			db.spec.observeClock(r.Now)
			break
		}
	}
	var writes []unitWrite
	for i, u := range units {
		if u.Err != nil {
			continue
		}
		w, err := u.Decide(reads[i])
		if err != nil {
			return err
		}
		if !w.Empty() {
			writes = append(writes, unitWrite{u: u, w: w})
		}
	}
	if len(writes) == 0 {
		return nil // nothing to write: the deferred rollback ends it
	}
	mark := newCommitMark(writes[0].u.Fence.ServerID)
	committing, err := writeGroup(ctx, conn, mark, writes)
	if err != nil && committing {
		return db.commitOutcome(ctx, mark, err)
	}
	return err
}

// unitWrite is what one unit decided to write.
type unitWrite struct {
	u *stock.Unit
	w *stock.BatchWrite
}

// Error codes raised by shardstock_expect inside a write statement.
const (
	sqlstateConflict = "SS001"
	sqlstateDiverged = "SS002"
	sqlstateUnique   = "23505"
)

// writeGroup is the group's second round trip, ending in COMMIT. Its rows
// are written by one statement (groupWrite.statement): each statement
// costs Postgres a bind, an executor start and end and a portal whatever
// its rows, and a hot group wrote four kinds of row with four (measured:
// docs/bench-log/2026-12-04.md). Operations are inserted in the order of their key,
// (sku, idempotency_key) (so two batches never deadlock on the unique
// index); a key that conflicts was taken by another shard of its SKU
// meanwhile, and the unique violation aborts the
// transaction, so that the batch is rerun (the rerun's lookup then sees
// the key as a replay) rather than counted a success. Each shard row is
// updated once, compare-and-set against its writer's copy.
//
// The group's commit mark is in the same statement: it is how a lost
// COMMIT's outcome is learnt (commitOutcome), and a void of it that got in
// first (the outcome was asked while this transaction still ran) then
// aborts it at once.
//
// committing is true when the error may have come from the COMMIT itself,
// whose outcome must then be learnt.
func writeGroup(ctx context.Context, conn *groupConn, mark commitMark, writes []unitWrite) (committing bool, err error) {
	g := mergeWrites(writes)
	b := &pgx.Batch{}
	g.queue(b, mark)
	b.Queue("COMMIT")
	return sendCommit(ctx, conn, b)
}

// groupWrite is every unit's writes merged, so that each kind of row is
// written once for the whole group.
type groupWrite struct {
	all                stock.BatchWrite
	shards             []shardMove
	usageAdd, usageSub []usageDelta
	epochs             []int64 // of each ledger entry: its writer's
	checkpoints        []checkpoint
}

func mergeWrites(writes []unitWrite) *groupWrite {
	g := &groupWrite{epochs: make([]int64, 0)}
	for _, uw := range writes {
		w := uw.w
		g.all.Ops = append(g.all.Ops, w.Ops...)
		g.all.NewReservations = append(g.all.NewReservations, w.NewReservations...)
		g.all.Ended = append(g.all.Ended, w.Ended...)
		g.all.Steps = append(g.all.Steps, w.Steps...)
		g.all.Extended = append(g.all.Extended, w.Extended...)
		g.all.Refunds = append(g.all.Refunds, w.Refunds...)
		g.all.Applied = append(g.all.Applied, w.Applied...)
		g.all.Ledger = append(g.all.Ledger, w.Ledger...)
		for range w.Ledger {
			g.epochs = append(g.epochs, uw.u.Fence.Epoch)
		}
		if w.Checkpoint != stock.CheckpointNone && len(w.Ledger) > 0 {
			g.checkpoints = append(g.checkpoints, checkpoint{shard: uw.u.Query.Shard, ifDue: w.Checkpoint == stock.CheckpointIfDue})
		}
		sku := uw.u.Query.Shard.SKU
		for c, q := range w.UsageAdd {
			g.usageAdd = addUsage(g.usageAdd, usageDelta{sku: sku, customer: c, quantity: q, limit: w.UsageLimit})
		}
		for c, q := range w.UsageSub {
			g.usageSub = addUsage(g.usageSub, usageDelta{sku: sku, customer: c, quantity: q})
		}
		// A speculative seeded batch decided from a seed, which is never
		// trusted: its row is compared even when its counts do not move
		// (a replenish and an adjust that cancel), else its ledger would
		// start from the seed and a halt go unseen.
		if q := uw.u.Query; w.From != w.To || (q.Seeded && !q.LoadShard) {
			g.shards = append(g.shards, shardMove{shard: q.Shard, from: w.From, to: w.To})
		}
	}
	return g
}

// queue queues the group's write statements: first the one statement of
// the rows only this group writes or inserts (mark, operations,
// reservations, shard rows, ledger), then the rows that other groups may
// write too, each kind in one order for every group, so that two groups
// never deadlock: operations by SKU and key (in the first statement), customer
// usage by SKU and customer, then transfers.
func (g *groupWrite) queue(b *pgx.Batch, mark commitMark) {
	sql, args := joinParts(g.parts(mark))
	b.Queue(sql, args...)
	// Give units back before taking more, as the planner counted them.
	if len(g.usageSub) > 0 {
		queueUsageSub(b, g.usageSub)
	}
	if len(g.usageAdd) > 0 {
		queueUsageAdd(b, g.usageAdd)
	}
	if len(g.all.Refunds) > 0 {
		queueRefunds(b, g.all.Refunds)
	}
	if len(g.all.Steps) > 0 {
		queueStepTransfers(b, g.all.Steps)
	}
}

// parts are the group's rows as the parts of one statement: each kind is
// a data-modifying WITH query, and the rows of each are disjoint from the
// others' (no part reads what another writes), so that running them on one
// snapshot changes nothing. The one exception says so: checkpoints read
// the entries the ledger part returns. Operations, ends and checkpoints
// also read the group's number (groupedPart), which writes nothing. Usage and transfer steps stay statements of
// their own: one group may touch one usage row twice (given back, then
// taken), which one statement may not.
func (g *groupWrite) parts(mark commitMark) []writePart {
	slices.SortFunc(g.all.Ops, compareOps)
	server := mark.server
	parts := []writePart{markPart(mark)}
	if len(g.all.Ops) > 0 || len(g.all.Ended) > 0 || len(g.checkpoints) > 0 {
		parts = append(parts, groupedPart)
	}
	if len(g.all.Ops) > 0 {
		parts = append(parts, opsPart(g.all.Ops))
	}
	if len(g.all.Applied) > 0 {
		parts = append(parts, appliedPart(g.all.Applied))
	}
	if len(g.all.NewReservations) > 0 {
		parts = append(parts, reservationsPart(g.all.NewReservations))
	}
	if len(g.all.Ended) > 0 {
		parts = append(parts, endsPart(g.all.Ended))
	}
	if len(g.all.Extended) > 0 {
		parts = append(parts, extendsPart(g.all.Extended))
	}
	if len(g.shards) > 0 {
		parts = append(parts, shardsPart(g.shards))
	}
	if len(g.all.Ledger) > 0 {
		parts = append(parts, ledgerPart(server, g.epochs, g.all.Ledger, len(g.checkpoints) > 0))
	}
	if len(g.checkpoints) > 0 {
		parts = append(parts, checkpointPart(g.checkpoints))
	}
	return parts
}

// writePart is one data-modifying WITH query of a group's write
// statement: its SQL numbers its own arguments from $1.
type writePart struct {
	name  string // the WITH query's name
	sql   string
	args  []any
	check *rowCheck // nil: its rows are not counted
}

// rowCheck is the number of rows a part must return (it ends in
// RETURNING), checked with shardstock_expect: another count aborts the
// transaction with code before the COMMIT queued behind it.
type rowCheck struct {
	want       int
	what, code string
}

// joinParts makes one statement of parts: each part's arguments are
// renumbered after those of the parts before it, and the statement's
// result is the check of every part that has one. The SQL depends only on
// which parts there are (each kind's SQL and number of arguments are
// fixed), so it is built once per combination (joinedSQL).
func joinParts(parts []writePart) (string, []any) {
	var key strings.Builder
	n := 0
	for _, p := range parts {
		n += len(p.args) + 1
		fmt.Fprintf(&key, "%s/%d/%t,", p.name, len(p.args), p.check != nil)
	}
	args := make([]any, 0, n)
	for _, p := range parts {
		args = append(args, p.args...)
		if p.check != nil {
			args = append(args, p.check.want)
		}
	}
	if sql, ok := joinedSQL.Load(key.String()); ok {
		return sql.(string), args
	}
	sql := joinSQL(parts)
	joinedSQL.Store(key.String(), sql)
	return sql, args
}

// joinedSQL caches joinSQL by the parts' names, argument counts and
// checks: a few dozen combinations at most.
var joinedSQL sync.Map

func joinSQL(parts []writePart) string {
	var sb strings.Builder
	var checks []string
	sb.WriteString("WITH ")
	offset := 0
	for i, p := range parts {
		if i > 0 {
			sb.WriteString(",\n")
		}
		fmt.Fprintf(&sb, "%s AS (%s)", p.name, placeholder.ReplaceAllStringFunc(p.sql, func(m string) string {
			n, _ := strconv.Atoi(m[1:])
			return "$" + strconv.Itoa(n+offset)
		}))
		offset += len(p.args)
		if p.check != nil {
			offset++
			checks = append(checks, fmt.Sprintf("shardstock_expect((SELECT count(*) FROM %s), $%d, '%s', '%s')", p.name, offset, p.check.what, p.check.code))
		}
	}
	sb.WriteString("\nSELECT ")
	if len(checks) == 0 {
		sb.WriteString("1")
	}
	sb.WriteString(strings.Join(checks, ", "))
	return sb.String()
}

// placeholder matches an argument's placeholder in a part's SQL.
var placeholder = regexp.MustCompile(`\$[0-9]+`)

// groupConn is the connection a group runs on. A COMMIT that outlives the
// group's deadline keeps it (sendCommit): the group then leaves its
// release to the COMMIT.
type groupConn struct {
	*pgxpool.Conn
	detached bool
}

// release ends a transaction left open and gives the connection back to
// the pool, unless a COMMIT still waiting on it has kept it.
func (c *groupConn) release(ctx context.Context) {
	if c.detached {
		return
	}
	endTx(ctx, c.Conn.Conn())
	c.Conn.Release()
}

// sendCommit sends b, whose last statement is COMMIT, and reads every
// answer until ctx ends. committing is true when the error may have come
// from the COMMIT itself, whose outcome must then be learnt.
//
// b runs without ctx's deadline, on a goroutine of its own. A COMMIT that
// waits for a synchronous standby has committed locally and must be left
// waiting: pgx answers a deadline by closing the connection, which sends
// Postgres a cancel request, and a cancelled wait for the standby shows
// the commit to everyone before the standby has it ("canceling wait for
// synchronous replication due to user request"). A failover would then
// lose what others had read, and a replay or GetOperation acknowledged.
// So when ctx ends first, sendCommit returns (its outcome is unknown, and
// commitOutcome waits for it through the commit mark) and leaves the
// connection to the goroutine, which releases it once Postgres answers or
// the connection breaks. At most the pool's connections wait so: a group
// that finds none is not committed.
func sendCommit(ctx context.Context, conn *groupConn, b *pgx.Batch) (committing bool, err error) {
	type answer struct {
		committing bool
		err        error
	}
	done := make(chan answer, 1)
	go func() {
		c, err := sendCommitWait(context.WithoutCancel(ctx), conn.Conn.Conn(), b)
		done <- answer{c, err}
	}()
	select {
	case a := <-done:
		return a.committing, a.err
	case <-ctx.Done():
	}
	conn.detached = true
	go func() {
		<-done
		endTx(context.Background(), conn.Conn.Conn())
		conn.Conn.Release()
	}()
	return true, fmt.Errorf("postgres: commit not answered in time, left to finish: %w", ctx.Err())
}

// sendCommitWait is sendCommit's wait for every answer, on the calling
// goroutine.
func sendCommitWait(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) (committing bool, err error) {
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
			// The statements behind it, COMMIT too, were skipped up to the
			// batch's Sync, which leaves the transaction open and failed:
			// end it, so that the connection can run the next one.
			res.Close()
			endTx(ctx, conn)
			return false, classify(err)
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
		return false, fmt.Errorf("%w: transaction still open after COMMIT (%c)", stock.ErrNotCommitted, st)
	}
	return false, nil
}

// endTx rolls back a transaction left open on conn (empty, refused or
// failed); a connection that cannot is closed, and the pool drops it on
// release.
func endTx(ctx context.Context, conn *pgx.Conn) {
	if conn.PgConn().TxStatus() == 'I' || conn.IsClosed() {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		conn.Close(rctx)
	}
}

// shardMove is one shard row's compare-and-set.
type shardMove struct {
	shard    stock.ShardKey
	from, to stock.Counts
}

// usageDelta is one customer's change of usage of one SKU.
type usageDelta struct {
	sku, customer   string
	quantity, limit int64
}

// addUsage adds d to ds, summing with an entry of the same SKU and customer
// (two shards of one SKU in one group): one statement may touch a row once.
func addUsage(ds []usageDelta, d usageDelta) []usageDelta {
	for i := range ds {
		if ds[i].sku == d.sku && ds[i].customer == d.customer {
			ds[i].quantity += d.quantity
			return ds
		}
	}
	return append(ds, d)
}

// classify maps a write statement's error to a batch error.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateConflict, sqlstateUnique:
			return fmt.Errorf("%w: %s", stock.ErrConflict, pgErr.Message)
		case sqlstateDiverged:
			return fmt.Errorf("%w: %s", stock.ErrDiverged, pgErr.Message)
		}
	}
	return notCommitted("write", err)
}

func notCommitted(step string, err error) error {
	return fmt.Errorf("%w: %s: %v", stock.ErrNotCommitted, step, err)
}

// compareOps orders operations as their primary key, (sku,
// idempotency_key), orders them: every group inserts its keys in that
// order, so that two never wait for each other's keys crosswise.
func compareOps(a, b *stock.Operation) int {
	if c := compareStrings(a.SKU, b.SKU); c != 0 {
		return c
	}
	return compareStrings(a.IdempotencyKey, b.IdempotencyKey)
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
