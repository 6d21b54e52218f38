package postgres

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// A group whose batches need no read but their keys' (deducts and
// reserves, on SKUs without a customer limit, of writers that have their
// shard's row and SKU) is decided before anything is read, and written in
// one round trip instead of two: BEGIN, one statement, COMMIT. The
// decisions assume what the read would have said in the common case, and
// the statement checks each assumption before anything it wrote can
// commit:
//   - every key is new: each keyed request of each batch must have become
//     an operation, which the insert's unique index then proves new (a
//     request refused under this assumption, e.g. OUT_OF_STOCK, might have
//     been a replay, so such a group is not sent at all);
//   - the SKUs are as their writers last read them (each read's row
//     version, drawn anew at every change of the row: migration 00023);
//   - the fences: each partition's owner and epoch, locked FOR SHARE as
//     the read would have.
//
// A writer that has no copy of its row yet (a cold SKU's first batch,
// LoadShard) does not keep its group from this: its SKU and its SKU's
// shard rows are read first, outside the transaction, and it decides from
// that read as from a seed (the write compares its row, halt included, and
// checks its SKU as any other unit's). Without it, every group that holds
// a cold SKU's first batch, nearly every group of a load spread over many
// cold SKUs, would run the usual way: a round trip of five reads, the
// fences locked, and the keys looked up, where this reads two things
// without a lock (docs/bench-log/2026-12-05-modelc2.md).
//
// When one does not hold, the transaction aborts and the group runs the
// usual way, on the same connection: its batches are decided again from
// what is read, so a replay, a paused SKU or a takeover is answered
// exactly as before. After a key that was not new, speculation pauses for
// speculateSkipAfterConflict groups: a load of retries and duplicates
// would otherwise pay for an aborted transaction in every group.
const (
	speculateSkipAfterConflict = 32
	// sqlstateStale is raised by the statement when a fence or a SKU is
	// not what the group assumed.
	sqlstateStale = "SS003"
)

// speculation is a DB's state and counts of speculative groups.
type speculation struct {
	// clockOffset is the database clock less this process's, in
	// nanoseconds, as last read by a group: a speculative group's
	// BatchRead.Now is this process's clock plus it.
	clockOffset atomic.Int64
	// skew is added to the estimate (SkewClock); 0 but in tests.
	skew      atomic.Int64
	skip      atomic.Int32 // groups left before speculating again
	committed atomic.Int64
	fellBack  atomic.Int64
	readFirst atomic.Int64 // groups that read a cold SKU's rows first (readFirst)
}

// Speculated returns how many groups committed in one round trip, and how
// many were sent so but ran the usual way, since Open.
func (db *DB) Speculated() (committed, fellBack int64) {
	return db.spec.committed.Load(), db.spec.fellBack.Load()
}

// ReadFirst returns how many groups, sent speculatively or not, read
// their cold SKUs' rows first, outside their transaction, since Open.
func (db *DB) ReadFirst() int64 { return db.spec.readFirst.Load() }

// SkewClock shifts by d, from now on, the estimate of the database's
// clock that speculative groups are evaluated with (this process's clock
// plus the offset last read): a test's stand-in for a process whose clock
// runs apart from the database's. The database's clock still decides
// every write (assumedParts).
func (db *DB) SkewClock(d time.Duration) { db.spec.skew.Store(int64(d)) }

// observeClock records the database clock now read by a group.
func (s *speculation) observeClock(dbNow time.Time) {
	s.clockOffset.Store(int64(dbNow.Sub(time.Now())))
}

// speculable reports whether every unit's batch can be decided without a
// read in the transaction: keyed requests, and commits and releases of
// reservations its writer knows held (not on a SKU with a customer limit,
// whose usage a release gives back). A unit that loads its row (LoadShard)
// qualifies with keys only; its SKU is checked once read (preRead).
func speculable(units []*stock.Unit) bool {
	for _, u := range units {
		q := u.Query
		if (q.KnownSKU == nil && !q.LoadShard) || (len(q.Keys) == 0 && len(q.ReservationIDs) == 0) || len(q.TransferIDs) > 0 ||
			q.SweepMax > 0 || len(q.Sales) > 0 || q.Extending || (q.LoadShard && len(q.ReservationIDs) > 0) {
			return false
		}
		// A SKU of version 0 was not read from storage, or its row is not
		// yet backfilled (migration 00024): nothing to check it against.
		if q.KnownSKU != nil && (q.KnownSKU.Version == 0 || !speculableOn(q, q.KnownSKU)) {
			return false
		}
	}
	return true
}

// speculableOn reports whether q's batch can be decided without a read on
// sku's settings: no customer limit to read usage of, no order recorded
// once.
func speculableOn(q stock.BatchQuery, sku *stock.SKU) bool {
	if (len(q.Customers) > 0 && sku.CustomerLimit > 0) || (len(q.Orders) > 0 && sku.OnePerOrder) {
		return false
	}
	return len(q.ReservationIDs) == 0 || (sku.CustomerLimit == 0 && knowsAll(q.KnownHeld, q.ReservationIDs))
}

// preRead is what a speculative group read first, outside its
// transaction, for the units that load their row: their SKUs and every
// shard row of each, and the database's clock.
type preRead struct {
	skus   map[string]*stock.SKU
	loaded map[stock.ShardKey]*loadedShard
	now    time.Time
}

// readFirst reads, on conn and outside any transaction, what the units that
// load their row need to decide (nil if none does). Nothing is locked: the
// rows are seeds, which the group's write checks (the shard row's counts
// and halt, the SKU's settings, the fence) before anything can commit.
func readFirst(ctx context.Context, conn *pgx.Conn, units []*stock.Unit) (*preRead, error) {
	var skus []string
	for _, u := range units {
		if u.Query.LoadShard && !slices.Contains(skus, u.Query.Shard.SKU) {
			skus = append(skus, u.Query.Shard.SKU)
		}
	}
	if len(skus) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	// The same statements as the usual way's read (groupQuery.queue), so
	// that each connection prepares and plans them once.
	b.Queue(`SELECT s.* FROM (SELECT unnest($1::text[]) AS sku) AS k CROSS JOIN LATERAL (`+sqlSelectSKU+` = k.sku) s`, skus)
	b.Queue(sqlSelectLoadShards, skus)
	b.Queue(`SELECT now()`)
	res := conn.SendBatch(ctx, b)
	defer res.Close()
	pre := &preRead{}
	var err error
	if pre.skus, err = scanSKUs(res); err != nil {
		return nil, err
	}
	if pre.loaded, err = scanLoaded(res); err != nil {
		return nil, err
	}
	if err := res.QueryRow().Scan(&pre.now); err != nil {
		return nil, err
	}
	return pre, res.Close()
}

// seed gives u's read what preRead found of its shard and SKU, and makes
// its query say so; false if u cannot be decided from it (its SKU or row
// missing, its shard halted, its SKU's settings need a read).
func (pre *preRead) seed(u *stock.Unit, read *stock.BatchRead) bool {
	sku, l := pre.skus[u.Query.Shard.SKU], pre.loaded[u.Query.Shard]
	if sku == nil || l == nil || l.halt != "" || !speculableOn(u.Query, sku) {
		return false
	}
	var siblings []stock.ShardRow
	for k, r := range pre.loaded {
		if k.SKU == u.Query.Shard.SKU && k.Index != u.Query.Shard.Index && r.halt == "" {
			siblings = append(siblings, stock.ShardRow{Index: k.Index, Counts: r.counts})
		}
	}
	counts := l.counts
	read.SKU, read.ShardRead, read.Counts, read.Siblings = sku, true, &counts, siblings
	// The statement checks the SKU as read (assumedParts), and the row as
	// a seed's: compared even when its counts do not move (mergeWrites).
	// Should the group run the usual way after all, Group turns a seeded
	// unit back into one that loads its row in the transaction.
	u.Query.KnownSKU, u.Query.LoadShard, u.Query.Seeded = sku, false, true
	return true
}

// knowsAll reports whether held has every one of ids.
func knowsAll(held map[string]*stock.Reservation, ids []string) bool {
	for _, id := range ids {
		if held[id] == nil {
			return false
		}
	}
	return true
}

// speculate tries units as one speculative group on conn. done is false
// when the group must run the usual way: it was not sent (a request was
// refused, or an error decided), or the database refused an assumption
// (nothing was written). Otherwise err is the group's outcome, as Group's.
func (db *DB) speculate(ctx context.Context, conn *groupConn, units []*stock.Unit) (done bool, err error) {
	if db.spec.skip.Load() > 0 {
		db.spec.skip.Add(-1)
		return false, nil
	}
	pre, err := readFirst(ctx, conn.Conn.Conn(), units)
	if err != nil {
		return false, nil // the usual way reads again, and reports what fails
	}
	if pre != nil {
		db.spec.readFirst.Add(1)
		db.spec.observeClock(pre.now)
	}
	// To the microsecond, as Postgres keeps a timestamp: an answer built
	// from this clock (an operation's created_at, a hold's expiry) is then
	// the one a replay reads back (TestDB_GroupSpeculative/OneRoundTrip; TestShard_SourceCase saw a replay differ).
	now := time.Now().Add(time.Duration(db.spec.clockOffset.Load() + db.spec.skew.Load())).Truncate(time.Microsecond)
	writes := make([]unitWrite, 0, len(units))
	// What the read would have found, assumed: nothing. The planner only
	// reads these, so every unit shares them, as the usual way's do.
	nothing := stock.BatchRead{Ops: map[string]*stock.Operation{}, Reservations: map[string]*stock.Reservation{},
		Usage: map[string]int64{}, Transfers: map[string]*stock.Transfer{}, MoveFences: map[string]int64{}, Now: now}
	for _, u := range units {
		read := nothing
		read.SKU = u.Query.KnownSKU
		if u.Query.LoadShard && !pre.seed(u, &read) {
			return false, nil
		}
		if len(u.Query.ReservationIDs) > 0 {
			// Assumed held: the write ends each only if it is
			// (endsPart's check), so a commit or release decided
			// from a reservation ended meanwhile writes nothing.
			read.Reservations = u.Query.KnownHeld
		}
		w, err := u.Decide(&read)
		if err != nil || !everyKeyNew(u.Query.Keys, w) {
			return false, nil
		}
		writes = append(writes, unitWrite{u: u, w: w})
	}
	g := mergeWrites(writes)
	if len(g.usageAdd) > 0 || len(g.usageSub) > 0 || len(g.all.Steps) > 0 {
		// Statements of their own (groupWrite.queue), which this one round
		// trip does not send; speculable keeps them out, and this makes
		// sure a decision that has them runs the usual way.
		return false, nil
	}
	mark := newCommitMark(writes[0].u.Fence.ServerID)
	sql, args := joinParts(append(assumedParts(units, selling(writes)), g.parts(mark)...))
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	committing, err := sendCommit(ctx, conn, b)
	switch {
	case err == nil:
		db.spec.committed.Add(1)
		return true, nil
	case committing:
		// The answer to COMMIT was lost (a takeover ended this backend
		// as a blocker, the connection broke): the group counts as
		// committed once its mark says it was.
		if err = db.commitOutcome(ctx, mark, err); err == nil {
			db.spec.committed.Add(1)
		}
		return true, err
	}
	// The database refused before COMMIT: nothing was written, and
	// sendCommit ended the failed transaction.
	db.spec.fellBack.Add(1)
	if errors.Is(err, stock.ErrConflict) {
		db.spec.skip.Store(speculateSkipAfterConflict)
	}
	return false, nil
}

// everyKeyNew reports whether every key of a batch became one of its
// operations: then the insert checks the lot.
func everyKeyNew(keys []string, w *stock.BatchWrite) bool {
	written := make(map[string]bool, len(w.Ops))
	for _, o := range w.Ops {
		written[o.IdempotencyKey] = true
	}
	for _, k := range keys {
		if !written[k] {
			return false
		}
	}
	return true
}

// selling returns the SKUs a speculative group reserves or deducts: the
// ones whose sale window its statement checks.
func selling(writes []unitWrite) map[string]bool {
	out := map[string]bool{}
	for _, uw := range writes {
		for _, o := range uw.w.Ops {
			if o.Kind == stock.OpReserve || o.Kind == stock.OpDeduct {
				out[o.SKU] = true
			}
		}
	}
	return out
}

// assumedParts check a speculative group's fences and SKUs, first in the
// statement (checks run in order), so that a stale group writes nothing.
// A SKU the group sells must be inside its sale window at the
// transaction's now(): the group was evaluated with this process's
// estimate of the database clock, and the database's clock decides.
func assumedParts(units []*stock.Unit, sells map[string]bool) []writePart {
	type fence struct {
		part  int32
		owner string
		epoch int64
	}
	var parts []int32
	var owners, skus []string
	var epochs, versions []int64
	var sell []bool
	type read struct {
		sku     string
		version int64
	}
	seenFence, seenSKU := map[fence]bool{}, map[read]bool{}
	for _, u := range units {
		f := fence{u.Fence.Partition, u.Fence.ServerID, u.Fence.Epoch}
		if !seenFence[f] {
			seenFence[f] = true
			parts, owners, epochs = append(parts, f.part), append(owners, f.owner), append(epochs, f.epoch)
		}
		// Each writer's read of its SKU, not each SKU once: two writers
		// of one SKU may hold reads from either side of a change, and the
		// older must fail the check too (two versions of one SKU cannot
		// both match its row, so the count falls short).
		if s := u.Query.KnownSKU; !seenSKU[read{s.Name, s.Version}] {
			seenSKU[read{s.Name, s.Version}] = true
			skus, versions, sell = append(skus, s.Name), append(versions, s.Version), append(sell, sells[s.Name])
		}
	}
	// A SKU is as its writer read it when its row's version is (migration
	// 00023: every change of the row draws a new one): one array for the
	// group's SKUs, where comparing each setting took one each, and each
	// array parameter costs the statement's bind and the executor
	// (docs/bench-log/2026-12-06-params.md).
	return []writePart{
		{name: "fenced", sql: `SELECT 1 FROM partitions p
			JOIN (SELECT unnest($1::int[]) AS part, unnest($2::text[]) AS owner, unnest($3::bigint[]) AS epoch) f ON p.partition = f.part
			WHERE p.owner = f.owner AND p.epoch = f.epoch ORDER BY p.partition FOR SHARE OF p`,
			args: []any{parts, owners, epochs}, check: &rowCheck{want: len(parts), what: "fences as assumed", code: sqlstateStale}},
		{name: "known", sql: `SELECT 1 FROM skus s
			JOIN (SELECT unnest($1::text[]) AS sku, unnest($2::bigint[]) AS version, unnest($3::bool[]) AS sells) k ON s.sku = k.sku
			WHERE s.version = k.version
				AND (NOT k.sells OR ((s.sale_start IS NULL OR now() >= s.sale_start) AND (s.sale_end IS NULL OR now() < s.sale_end)))`,
			args:  []any{skus, versions, sell},
			check: &rowCheck{want: len(skus), what: "SKUs as assumed", code: sqlstateStale}},
	}
}
