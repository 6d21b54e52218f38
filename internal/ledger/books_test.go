package ledger_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	openTimeout = 30 * time.Second
	// statsWait bounds the wait for a backend's table statistics to reach
	// the views (a backend flushes them within a second or so of going idle).
	statsWait = 15 * time.Second
	// statsFlushInterval is the least time between two flushes of a
	// backend's statistics (Postgres's PGSTAT_MIN_INTERVAL), and a margin.
	statsFlushInterval = 1100 * time.Millisecond
)

// books is one test database, its service pool and a connection of its
// own (the owner's: outside the service).
type books struct {
	db   *postgres.DB
	conn *pgx.Conn
}

func openBooks(t *testing.T) *books { return openBooksConns(t, 0) }

// openBooksConns is openBooks with a service pool of at most maxConns
// connections (0: pgxpool's default).
func openBooksConns(t *testing.T, maxConns int32) *books {
	t.Helper()
	return openBooksAt(t, pgtest.NewMigratedDB(t), maxConns)
}

// openBooksAt is openBooksConns on the database at url.
func openBooksAt(t *testing.T, url string, maxConns int32) *books {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, url, postgres.Options{ApplicationName: "ledgertest", MaxConns: maxConns})
	if err != nil {
		t.Fatalf("Open(%s) = %v", url, err)
	}
	t.Cleanup(db.Close)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgx.Connect(%s) = %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &books{db: db, conn: conn}
}

func (b *books) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// fill creates sku with one shard whose ledger holds n replenishes of one
// unit, each with its operation, and the checkpoints its writer would have
// written (one every ledger.CheckpointEntries entries); the row is at n.
func (b *books) fill(t *testing.T, sku string, n int) {
	t.Helper()
	s := stock.SKU{Name: sku, Shards: 1, Status: stock.StatusActive, ReservationTTL: stock.ReservationTTLDefault}
	if err := b.db.CreateSKU(context.Background(), s, 0); err != nil {
		t.Fatalf("CreateSKU(%s) = %v", sku, err)
	}
	b.exec(t, `INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after, reserved_before, reserved_after,
		sold_before, sold_after, idempotency_key, source, server_id, epoch)
		SELECT $1, 0, 'replenish', 1, i - 1, i, 0, 0, 0, 0, 'k-' || i, 'test', 'test', 1 FROM generate_series(1, $2::int) i`, sku, n)
	b.exec(t, `INSERT INTO operations (sku, idempotency_key, kind, params_hash, quantity, shard)
		SELECT $1, 'k-' || i, 'replenish', '\x00', 1, 0 FROM generate_series(1, $2::int) i`, sku, n)
	b.exec(t, `INSERT INTO ledger_checkpoints (sku, shard, entry_id, available, reserved, sold, received)
		SELECT sku, shard, id, available_after, 0, 0, available_after FROM ledger WHERE sku = $1 AND available_after % $2 = 0`,
		sku, ledger.CheckpointEntries)
	b.exec(t, `UPDATE shards SET available = $2 WHERE sku = $1`, sku, n)
}

// settle vacuums and analyzes what fill wrote, and waits until the
// statistics of this connection's reads are in the views: what a
// measurement counts afterwards is only what it made.
func (b *books) settle(t *testing.T) {
	t.Helper()
	b.exec(t, `VACUUM ANALYZE ledger, operations, reservations, ledger_checkpoints`)
	b.exec(t, `SELECT pg_stat_force_next_flush()`)
	before := b.rowsRead(t)
	time.Sleep(time.Second)
	if after := b.rowsRead(t); after != before {
		t.Fatalf("rows read moved from %d to %d with nothing running", before, after)
	}
}

// rowsRead is the number of rows of the ledger, the operations and the
// reservations read since the database began: by sequential scans and as
// index entries.
func (b *books) rowsRead(t *testing.T) int64 {
	t.Helper()
	var n int64
	if _, err := b.conn.Exec(context.Background(), `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	err := b.conn.QueryRow(context.Background(), `SELECT
		(SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables WHERE relname IN ('ledger', 'operations', 'reservations'))
		+ (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relname IN ('ledger', 'operations', 'reservations'))`).Scan(&n)
	if err != nil {
		t.Fatalf("rows read: %v", err)
	}
	return n
}

// measure runs f and returns how long it took and how many rows of the
// ledger and the operations it read, once its backend has flushed them.
// A backend flushes its statistics when it goes idle if it last did a
// second or more before, else ten seconds later (PGSTAT_IDLE_INTERVAL):
// f may go idle twice within a second, so a second after it a statement
// that reads none of those tables makes the pool's backend (b's pool has
// one: openBooksConns) flush at once.
func (b *books) measure(t *testing.T, f func()) (time.Duration, int64) {
	t.Helper()
	before := b.rowsRead(t)
	start := time.Now()
	f()
	took := time.Since(start)
	time.Sleep(statsFlushInterval)
	if _, err := b.db.SKUs(context.Background(), "", 1); err != nil {
		t.Fatalf("SKUs() = %v", err)
	}
	for deadline := time.Now().Add(statsWait); ; time.Sleep(100 * time.Millisecond) {
		if n := b.rowsRead(t); n != before {
			time.Sleep(300 * time.Millisecond) // the rest of one flush
			return took, b.rowsRead(t) - before
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rows read counted within %v", statsWait)
		}
	}
}

// fence takes sku's shard 0 over for a writer of epoch 1.
func (b *books) fence(t *testing.T, sku string) (stock.Fence, stock.ShardKey) {
	t.Helper()
	k := stock.ShardKey{SKU: sku, Index: 0}
	f := stock.Fence{Partition: k.Partition(), Epoch: 1, ServerID: "srv-a"}
	if err := b.db.TakeOver(context.Background(), f.Partition, f.ServerID, f.Epoch); err != nil {
		t.Fatalf("TakeOver(%d) = %v", f.Partition, err)
	}
	return f, k
}

// longLedgerEnv, set to 1, makes TestCheckpoint_LongLedger fill ledgers of
// 100,000 and 1,000,000 entries (make test-long-ledger) instead of 10,000
// and 100,000: the same check, ten times longer ledgers, about a minute
// more of filling.
const longLedgerEnv = "SHARDSTOCK_LONG_LEDGER"

// TestCheckpoint_LongLedger reconciles a SKU and checks its shard with a
// ledger of 10,000 and of 100,000 entries (with longLedgerEnv, 100,000
// and 1,000,000): each reads the latest checkpoint and the entries after
// it, the same number of rows whatever the ledger's length, and fewer than
// the shorter ledger holds.
func TestCheckpoint_LongLedger(t *testing.T) {
	t.Parallel() // its own database (and etcd): nothing shared
	if testing.Short() {
		t.Skip("fills ledgers of up to a million entries")
	}
	sizes := []int{10_000, 100_000}
	if os.Getenv(longLedgerEnv) == "1" {
		sizes = []int{100_000, 1_000_000}
	}
	const tail = ledger.CheckpointEntries / 2 // entries after the last checkpoint
	// Each of the four ledger queries of a Snapshot (and CheckShard's
	// one) reads the tail once; operations are read by key. A read of the
	// whole ledger is more than ten times as much at the smaller size.
	const snapshotReadMax, checkReadMax = 6 * ledger.CheckpointEntries, 2 * ledger.CheckpointEntries
	b := openBooksConns(t, 1) // one backend, whose flushes measure makes sure of
	for _, n := range sizes {
		b.fill(t, skuOf(n), n+tail)
	}
	// Reservations of another SKU, ended long ago: a reconciliation that
	// scanned the table for its own would read them.
	b.exec(t, `INSERT INTO reservations (id, sku, shard, partition, idempotency_key, quantity, state, expires_at, ended_at)
		SELECT 'r-' || i, 'elsewhere', 0, 0, 'k-' || i, 1, 'committed', now(), now() - interval '1 day' FROM generate_series(1, 100000) i`)
	b.settle(t)
	type figures struct {
		snapTook, checkTook time.Duration
		snapRead, checkRead int64
	}
	var got []figures
	for _, n := range sizes {
		sku := skuOf(n)
		var fg figures
		fg.snapTook, fg.snapRead = b.measure(t, func() {
			snap, err := b.db.Snapshot(context.Background(), sku)
			if err != nil {
				t.Fatalf("Snapshot(%s) = %v", sku, err)
			}
			if ds := ledger.Check(snap); len(ds) > 0 {
				t.Errorf("Check(Snapshot(%s)) = %+v, want balanced", sku, ds)
			}
			if cp := snap.Shards[0].Checkpoint; cp == nil || cp.Counts.Available != int64(n) {
				t.Errorf("Snapshot(%s) checkpoint = %+v, want one at %d", sku, cp, n)
			}
		})
		f, k := b.fence(t, sku)
		fg.checkTook, fg.checkRead = b.measure(t, func() {
			c, err := b.db.CheckShard(context.Background(), f, k)
			if err != nil || !c.Consistent() || c.Row.Available != int64(n+tail) {
				t.Errorf("CheckShard(%s) = %+v, %v, want consistent at %d", k, c, err, n+tail)
			}
		})
		if fg.snapRead > snapshotReadMax {
			t.Errorf("reconciling %d entries read %d rows of the ledger, operations and reservations, want at most %d", n+tail, fg.snapRead, snapshotReadMax)
		}
		if fg.checkRead > checkReadMax {
			t.Errorf("CheckShard over %d entries read %d rows, want at most %d", n+tail, fg.checkRead, checkReadMax)
		}
		t.Logf("%d entries: reconcile read %d rows in %v, CheckShard read %d rows in %v", n+tail, fg.snapRead, fg.snapTook, fg.checkRead, fg.checkTook)
		got = append(got, fg)
	}
	t.Logf("%d / %d entries: reconcile time x%.2f, rows x%.2f; CheckShard time x%.2f, rows x%.2f", sizes[1], sizes[0],
		float64(got[1].snapTook)/float64(got[0].snapTook), float64(got[1].snapRead)/float64(got[0].snapRead),
		float64(got[1].checkTook)/float64(got[0].checkTook), float64(got[1].checkRead)/float64(got[0].checkRead))
}

func skuOf(n int) string { return "long-" + strconv.Itoa(n) }

// TestCheckpoint_Wrong: a checkpoint written outside the service, whose
// balance or receipts are not what the entries before it sum to, is
// caught by reconciliation and by CheckShard.
func TestCheckpoint_Wrong(t *testing.T) {
	t.Parallel() // its own database (and etcd): nothing shared

	const n = 2*ledger.CheckpointEntries + 100 // two checkpoints, then 100 entries
	last := int64(n - 10)                      // the wrong checkpoint's entry
	for _, tt := range []struct {
		name                string
		available, received int64
		want                []string
		consistent          bool
	}{
		{name: "Balance", available: last + 7, received: last, want: []string{ledger.CheckChain, ledger.CheckShardBalance}},
		{name: "Received", available: last, received: last - 5, want: []string{ledger.CheckConservation}, consistent: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := openBooks(t)
			sku := "wrong-" + tt.name
			b.fill(t, sku, n)
			f, k := b.fence(t, sku)
			b.exec(t, `INSERT INTO ledger_checkpoints (sku, shard, entry_id, available, reserved, sold, received)
				SELECT sku, shard, id, $3, 0, 0, $4 FROM ledger WHERE sku = $1 AND available_after = $2`, sku, last, tt.available, tt.received)
			snap, err := b.db.Snapshot(context.Background(), sku)
			if err != nil {
				t.Fatalf("Snapshot(%s) = %v", sku, err)
			}
			var checks []string
			for _, d := range ledger.Check(snap) {
				checks = append(checks, d.Check)
			}
			slices.Sort(checks)
			if checks = slices.Compact(checks); !slices.Equal(checks, tt.want) {
				t.Errorf("Check(Snapshot(%s)) checks = %v, want %v", sku, checks, tt.want)
			}
			c, err := b.db.CheckShard(context.Background(), f, k)
			if err != nil || c.Consistent() != tt.consistent {
				t.Errorf("CheckShard(%s) = %+v, %v, want consistent %t", k, c, err, tt.consistent)
			}
		})
	}
}

// TestReconcile_SkewedClocks: operations dated by a clock far ahead of the
// database's (a speculative group dates them by its process's) are paired
// with their entries by the order of their write groups, not by the time
// they bear: one written before the latest checkpoint but dated an hour
// after it is not an "operation without entry". An operation written after
// the checkpoint, without an entry, is still found, however far back it
// is dated.
func TestReconcile_SkewedClocks(t *testing.T) {
	t.Parallel() // its own database (and etcd): nothing shared
	const n = ledger.CheckpointEntries + 10
	b := openBooks(t)
	const sku = "skewed"
	b.fill(t, sku, n)
	b.exec(t, `UPDATE operations SET created_at = now() + interval '1 hour' WHERE sku = $1 AND idempotency_key IN ('k-1', 'k-500')`, sku)
	check := func() []ledger.Discrepancy {
		t.Helper()
		snap, err := b.db.Snapshot(context.Background(), sku)
		if err != nil {
			t.Fatalf("Snapshot(%s) = %v", sku, err)
		}
		return ledger.Check(snap)
	}
	if ds := check(); len(ds) > 0 {
		t.Errorf("Check(Snapshot(%s)) with operations dated ahead = %+v, want balanced", sku, ds)
	}
	b.exec(t, `INSERT INTO operations (sku, idempotency_key, kind, params_hash, quantity, shard, created_at)
		VALUES ($1, 'no-entry', 'deduct', '\x00', 1, 0, now() - interval '1 hour')`, sku)
	ds := check()
	if len(ds) != 1 || ds[0].Check != ledger.CheckOperationLedger || !strings.Contains(ds[0].Detail, "no-entry") {
		t.Errorf("Check(Snapshot(%s)) with an operation without entry dated back = %+v, want its %s", sku, ds, ledger.CheckOperationLedger)
	}
	// A reservation ended by hand, by no write group, without an end
	// entry: dated by the database after the checkpoint, it is found.
	b.exec(t, `INSERT INTO reservations (id, sku, shard, partition, idempotency_key, quantity, state, expires_at, ended_at)
		VALUES ('by-hand', $1, 0, 0, 'k-1', 1, 'released', now(), now())`, sku)
	if ds := check(); len(ds) != 2 || ds[1].Check != ledger.CheckReservationEnd || !strings.Contains(ds[1].Detail, "by-hand") {
		t.Errorf("Check(Snapshot(%s)) with a reservation ended by hand = %+v, want also its %s", sku, ds, ledger.CheckReservationEnd)
	}
}
