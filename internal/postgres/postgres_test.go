package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openTimeout bounds one Open in these tests (migrations included).
const openTimeout = 30 * time.Second

// mustOpen returns a migrated database of the test's own and its URL.
func mustOpen(tb testing.TB) (*postgres.DB, string) {
	tb.Helper()
	return openOn(tb, pgtest.NewMigratedDB(tb))
}

// openOn opens the database at url (migrating it if need be) for the test.
func openOn(tb testing.TB, url string) (*postgres.DB, string) {
	tb.Helper()
	return openWith(tb, url, postgres.Options{ApplicationName: "postgrestest"}), url
}

// openWith opens the database at url with opt for the test (a pool of its
// own, as a process has), closed when the test ends.
func openWith(tb testing.TB, url string, opt postgres.Options) *postgres.DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, url, opt)
	if err != nil {
		tb.Fatalf("Open(%s) = %v, want nil", url, err)
	}
	tb.Cleanup(db.Close)
	return db
}

// connect opens a plain pgx connection: the test's way around the adapter,
// to look at and to corrupt the database directly.
func connect(tb testing.TB, url string) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("pgx.Connect(%s) = %v", url, err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(tb testing.TB, conn *pgx.Conn, sql string, args ...any) pgconn.CommandTag {
	tb.Helper()
	tag, err := conn.Exec(context.Background(), sql, args...)
	if err != nil {
		tb.Fatalf("Exec(%s) = %v", sql, err)
	}
	return tag
}

func count(tb testing.TB, conn *pgx.Conn, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("QueryRow(%s) = %v", sql, err)
	}
	return n
}

func createSKU(tb testing.TB, db *postgres.DB, s stock.SKU, initial int64) {
	tb.Helper()
	if s.Status == "" {
		s.Status = stock.StatusActive
	}
	if s.ReservationTTL == 0 {
		s.ReservationTTL = stock.ReservationTTLDefault
	}
	if err := db.CreateSKU(context.Background(), s, initial); err != nil {
		tb.Fatalf("CreateSKU(%+v) = %v", s, err)
	}
}

func TestOpen_Migrations(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		db, url := openOn(t, pgtest.NewDB(t)) // from empty, as a new deployment
		conn := connect(t, url)
		for _, table := range []string{"skus", "shards", "partitions", "operations", "reservations", "customer_usage", "ledger"} {
			if n := count(t, conn, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name = $1`, table); n != 1 {
				t.Errorf("tables named %s = %d, want 1", table, n)
			}
		}
		if n := count(t, conn, `SELECT count(*) FROM partitions`); n != stock.Partitions {
			t.Errorf("partitions rows = %d, want %d", n, stock.Partitions)
		}
		if n := count(t, conn, `SELECT count(*) FROM partitions WHERE owner = '' AND epoch = 0`); n != stock.Partitions {
			t.Errorf("unowned partitions at epoch 0 = %d, want %d", n, stock.Partitions)
		}
		createSKU(t, db, stock.SKU{Name: "m-sku", Shards: 3}, 10)
		rows, err := db.Shards(context.Background(), "m-sku")
		if err != nil {
			t.Fatalf("Shards(m-sku) = %v", err)
		}
		if got := []int64{rows[0].Available, rows[1].Available, rows[2].Available}; !slices.Equal(got, []int64{4, 3, 3}) {
			t.Errorf("Shards(m-sku) available = %v, want [4 3 3]", got)
		}
	})

	t.Run("Idempotent", func(t *testing.T) {
		db, url := mustOpen(t)
		createSKU(t, db, stock.SKU{Name: "m-sku", Shards: 2}, 10)
		conn := connect(t, url)
		versions := count(t, conn, `SELECT count(*) FROM goose_db_version`)
		for i := range 2 {
			ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
			again, err := postgres.Open(ctx, url, postgres.Options{})
			cancel()
			if err != nil {
				t.Fatalf("Open #%d (already migrated) = %v, want nil", i+2, err)
			}
			again.Close()
		}
		if n := count(t, conn, `SELECT count(*) FROM goose_db_version`); n != versions {
			t.Errorf("goose_db_version rows after reopening = %d, want %d", n, versions)
		}
		if n := count(t, conn, `SELECT count(*) FROM partitions`); n != stock.Partitions {
			t.Errorf("partitions rows after reopening = %d, want %d", n, stock.Partitions)
		}
		if n := count(t, conn, `SELECT count(*) FROM shards WHERE sku = 'm-sku'`); n != 2 {
			t.Errorf("shards of m-sku after reopening = %d, want 2", n)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		// Many processes starting at once migrate once (advisory lock).
		url := pgtest.NewDB(t)
		const n = 4
		errs := make(chan error, n)
		for range n {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
				defer cancel()
				db, err := postgres.Open(ctx, url, postgres.Options{})
				if err == nil {
					db.Close()
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Errorf("concurrent Open = %v, want nil", err)
			}
		}
		conn := connect(t, url)
		if got := count(t, conn, `SELECT count(*) FROM partitions`); got != stock.Partitions {
			t.Errorf("partitions rows = %d, want %d", got, stock.Partitions)
		}
	})

	t.Run("MaxConnsOne", func(t *testing.T) {
		// Options.MaxConns bounds the pool; 1 is a valid bound and Open
		// must still migrate.
		url := pgtest.NewDB(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		db, err := postgres.Open(ctx, url, postgres.Options{MaxConns: 1})
		if err != nil {
			t.Fatalf("Open(MaxConns: 1) = %v, want nil", err)
		}
		db.Close()
	})
}

// ledgerRow inserts one well-formed ledger row directly, for the
// append-only checks.
const insertLedger = `INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after,
	reserved_before, reserved_after, sold_before, sold_after, idempotency_key, source, server_id, epoch)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'admin:test', 'test', 1)`

func TestLedger_AppendOnly(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	_, url := mustOpen(t)
	conn := connect(t, url)
	exec(t, conn, insertLedger, "a-sku", 0, "replenish", 5, 0, 5, 0, 0, 0, 0, "a-key")

	for _, tt := range []struct {
		name, sql string
	}{
		{"Update", `UPDATE ledger SET quantity = quantity + 1`},
		{"UpdateOneColumn", `UPDATE ledger SET reason = 'rewritten' WHERE idempotency_key = 'a-key'`},
		{"Delete", `DELETE FROM ledger`},
		{"Truncate", `TRUNCATE ledger`},
		{"TruncateCascade", `TRUNCATE ledger CASCADE`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := conn.Exec(context.Background(), tt.sql)
			if err == nil || !strings.Contains(err.Error(), "append-only") {
				t.Errorf("Exec(%s) = %v, want the append-only error", tt.sql, err)
			}
			if n := count(t, conn, `SELECT count(*) FROM ledger WHERE quantity = 5 AND reason = ''`); n != 1 {
				t.Errorf("ledger rows intact after %s = %d, want 1", tt.sql, n)
			}
		})
	}
	t.Run("Insert", func(t *testing.T) {
		exec(t, conn, insertLedger, "a-sku", 0, "deduct", 1, 5, 4, 0, 0, 0, 1, "b-key")
		if n := count(t, conn, `SELECT count(*) FROM ledger`); n != 2 {
			t.Errorf("ledger rows after an insert = %d, want 2", n)
		}
	})
}

func TestShards_CheckConstraints(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	db, url := mustOpen(t)
	createSKU(t, db, stock.SKU{Name: "c-sku", Shards: 1}, 10)
	conn := connect(t, url)
	for _, col := range []string{"available", "reserved", "sold"} {
		t.Run(col, func(t *testing.T) {
			sql := fmt.Sprintf(`UPDATE shards SET %s = -1 WHERE sku = 'c-sku'`, col)
			_, err := conn.Exec(context.Background(), sql)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
				t.Errorf("Exec(%s) = %v, want a check violation (23514)", sql, err)
			}
		})
	}
	t.Run("Insert", func(t *testing.T) {
		_, err := conn.Exec(context.Background(), `INSERT INTO shards (sku, idx, partition, available, reserved, sold, opening_available)
			VALUES ('c-sku', 1, 0, -5, 0, 0, 0)`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("INSERT shard with available -5 = %v, want a check violation (23514)", err)
		}
	})
	t.Run("OK", func(t *testing.T) {
		got, err := db.LoadShard(context.Background(), stock.ShardKey{SKU: "c-sku"})
		if err != nil || got != (stock.Counts{Available: 10}) {
			t.Errorf("LoadShard(c-sku#0) = %+v, %v, want {Available:10}, nil", got, err)
		}
	})
}

// booked is a SKU with real history, written by a shard server.
type booked struct {
	db        *postgres.DB
	conn      *pgx.Conn
	sku       string
	committed *stock.Reservation // a committed reservation on shard 0
	held      *stock.Reservation // a held reservation on shard 1
}

// book creates a SKU of two shards, runs deducts, reserves, commits,
// releases and a replenish through a shard server, and checks that the
// books balance.
func book(t *testing.T) *booked {
	t.Helper()
	db, url := mustOpen(t)
	b := &booked{db: db, conn: connect(t, url), sku: "rec-sku"}
	createSKU(t, db, stock.SKU{Name: b.sku, Shards: 2}, 20)

	srv := shard.New(shard.Config{ServerID: "srv-a", DB: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for i := range int32(2) {
		if err := srv.Acquire(context.Background(), stock.PartitionOf(b.sku, i), 1); err != nil {
			t.Fatalf("Acquire(%s#%d, 1) = %v", b.sku, i, err)
		}
	}

	do := func(r *stock.Request) stock.Result {
		t.Helper()
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		res := srv.Do(rctx, r)
		if res.Err != nil {
			t.Fatalf("Do(%s %s q=%d) = %v", r.Kind, r.Shard, r.Quantity, res.Err)
		}
		return res
	}
	s0, s1 := stock.ShardKey{SKU: b.sku, Index: 0}, stock.ShardKey{SKU: b.sku, Index: 1}
	do(&stock.Request{Kind: stock.OpDeduct, Shard: s0, Quantity: 2, Key: "deduct-1", OrderRef: "o-1"})
	do(&stock.Request{Kind: stock.OpDeduct, Shard: s1, Quantity: 1, Key: "deduct-2"})
	r1 := do(&stock.Request{Kind: stock.OpReserve, Shard: s0, Quantity: 3, Key: "reserve-1", CustomerRef: "c-1"}).Reservation
	do(&stock.Request{Kind: stock.OpCommit, Shard: s0, ReservationID: r1.ID})
	r2 := do(&stock.Request{Kind: stock.OpReserve, Shard: s0, Quantity: 1, Key: "reserve-2"}).Reservation
	do(&stock.Request{Kind: stock.OpRelease, Shard: s0, ReservationID: r2.ID, Reason: "changed mind"})
	r3 := do(&stock.Request{Kind: stock.OpReserve, Shard: s1, Quantity: 2, Key: "reserve-3"}).Reservation
	do(&stock.Request{Kind: stock.OpReplenish, Shard: s1, Quantity: 5, Key: "replenish-1"})
	b.committed, b.held = r1, r3

	// 10 - 2 - 3 on shard 0; 10 - 1 - 2 + 5 on shard 1.
	rows, err := db.Shards(context.Background(), b.sku)
	if err != nil {
		t.Fatalf("Shards(%s) = %v", b.sku, err)
	}
	want := []stock.ShardRow{
		{Index: 0, Counts: stock.Counts{Available: 5, Sold: 5}},
		{Index: 1, Counts: stock.Counts{Available: 12, Reserved: 2, Sold: 1}},
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("Shards(%s) = %+v, want %+v", b.sku, rows, want)
	}
	if got := b.reconcile(t); len(got) != 0 {
		t.Fatalf("Reconcile(Snapshot(%s)) before corruption = %v, want none", b.sku, got)
	}
	return b
}

// check is one discrepancy as the corruption tests compare it.
type check struct {
	Check string
	Shard int32
}

func (b *booked) reconcile(t *testing.T) []check {
	t.Helper()
	snap, err := b.db.Snapshot(context.Background(), b.sku)
	if err != nil {
		t.Fatalf("Snapshot(%s) = %v", b.sku, err)
	}
	ds := ledger.Check(snap)
	out := make([]check, len(ds))
	for i, d := range ds {
		out[i] = check{d.Check, d.Shard}
		t.Logf("discrepancy: %+v", d)
	}
	slices.SortFunc(out, compareChecks)
	return out
}

func compareChecks(a, b check) int {
	if c := strings.Compare(a.Check, b.Check); c != 0 {
		return c
	}
	return int(a.Shard - b.Shard)
}

func TestSnapshot_Reconcile(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		b := book(t)
		snap, err := b.db.Snapshot(context.Background(), b.sku)
		if err != nil {
			t.Fatalf("Snapshot(%s) = %v", b.sku, err)
		}
		if len(snap.Shards) != 2 || snap.Shards[0].Opening.Available != 10 || snap.Shards[1].Opening.Available != 10 {
			t.Errorf("Snapshot(%s).Shards = %+v, want two shards opened with 10", b.sku, snap.Shards)
		}
		if k := snap.Shards[0].Kinds[stock.OpDeduct]; k.Entries != 1 || k.Quantity != 2 {
			t.Errorf("Snapshot(%s) shard 0 deducts = %+v, want 1 entry of 2", b.sku, k)
		}
		if got := snap.Shards[1].HeldReserved; got != 2 {
			t.Errorf("Snapshot(%s) shard 1 held = %d, want 2", b.sku, got)
		}
	})

	t.Run("UnknownSKU", func(t *testing.T) {
		db, _ := mustOpen(t)
		_, err := db.Snapshot(context.Background(), "no-such-sku")
		if code := stock.CodeOf(err); code != stock.CodeSKUNotFound {
			t.Errorf("Snapshot(no-such-sku) = %v, want %s", err, stock.CodeSKUNotFound)
		}
	})

	for _, tt := range []struct {
		name    string
		corrupt func(t *testing.T, b *booked)
		want    []check
	}{
		{
			name: "AvailableBumped",
			corrupt: func(t *testing.T, b *booked) {
				exec(t, b.conn, `UPDATE shards SET available = available + 1 WHERE sku = $1 AND idx = 0`, b.sku)
			},
			want: []check{{ledger.CheckConservation, -1}, {ledger.CheckShardBalance, 0}},
		},
		{
			name: "OperationDeleted",
			corrupt: func(t *testing.T, b *booked) {
				if tag := exec(t, b.conn, `DELETE FROM operations WHERE idempotency_key = 'deduct-1'`); tag.RowsAffected() != 1 {
					t.Fatalf("DELETE operation deduct-1 = %d rows, want 1", tag.RowsAffected())
				}
			},
			want: []check{{ledger.CheckOperationLedger, -1}},
		},
		{
			name: "BogusEntry",
			// A deduct entry for a key nobody used, chained where shard 0
			// ended, but the row never moved.
			corrupt: func(t *testing.T, b *booked) {
				exec(t, b.conn, insertLedger, b.sku, 0, "deduct", 1, 5, 4, 0, 0, 5, 6, "bogus-key")
			},
			want: []check{{ledger.CheckOperationLedger, -1}, {ledger.CheckShardBalance, 0}, {ledger.CheckShardBalance, 0}},
		},
		{
			name: "BogusEntryUnchained",
			// The same entry, but starting from nowhere.
			corrupt: func(t *testing.T, b *booked) {
				exec(t, b.conn, insertLedger, b.sku, 0, "deduct", 1, 100, 99, 0, 0, 0, 1, "bogus-key")
			},
			want: []check{{ledger.CheckChain, 0}, {ledger.CheckOperationLedger, -1}, {ledger.CheckShardBalance, 0}, {ledger.CheckShardBalance, 0}},
		},
		{
			name: "CommittedBackToHeld",
			corrupt: func(t *testing.T, b *booked) {
				exec(t, b.conn, `UPDATE reservations SET state = 'held', ended_at = NULL WHERE id = $1`, b.committed.ID)
			},
			want: []check{{ledger.CheckReservationEnd, -1}, {ledger.CheckReservedHolds, 0}},
		},
		{
			name: "HeldMarkedReleased",
			// A hold ended without an entry or giving its stock back.
			corrupt: func(t *testing.T, b *booked) {
				exec(t, b.conn, `UPDATE reservations SET state = 'released', ended_at = now() WHERE id = $1`, b.held.ID)
			},
			want: []check{{ledger.CheckReservationEnd, -1}, {ledger.CheckReservedHolds, 1}},
		},
		{
			name: "SoldRaised",
			corrupt: func(t *testing.T, b *booked) {
				exec(t, b.conn, `UPDATE shards SET sold = sold + 3 WHERE sku = $1 AND idx = 1`, b.sku)
			},
			want: []check{{ledger.CheckConservation, -1}, {ledger.CheckShardBalance, 1}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // its own database and shard server
			b := book(t)
			tt.corrupt(t, b)
			got, want := b.reconcile(t), slices.Clone(tt.want)
			slices.SortFunc(want, compareChecks)
			if !slices.Equal(got, want) {
				t.Errorf("Reconcile(Snapshot(%s)) after %s = %v, want %v", b.sku, tt.name, got, want)
			}
		})
	}
}

func TestDB_TakeOver(t *testing.T) {
	ctx := context.Background()
	owner := func(t *testing.T, db *postgres.DB, p int32, wantOwner string, wantEpoch int64) {
		t.Helper()
		o, e, err := db.PartitionOwner(ctx, p)
		if err != nil || o != wantOwner || e != wantEpoch {
			t.Errorf("PartitionOwner(%d) = %s, %d, %v, want %s, %d, nil", p, o, e, err, wantOwner, wantEpoch)
		}
	}

	t.Run("OK", func(t *testing.T) {
		db, _ := mustOpen(t)
		if err := db.TakeOver(ctx, 7, "a", 1); err != nil {
			t.Fatalf("TakeOver(7, a, 1) = %v, want nil", err)
		}
		owner(t, db, 7, "a", 1)
		if err := db.TakeOver(ctx, 7, "b", 5); err != nil {
			t.Fatalf("TakeOver(7, b, 5) = %v, want nil", err)
		}
		owner(t, db, 7, "b", 5)
		owner(t, db, 8, "", 0) // other partitions untouched
	})

	t.Run("SameEpoch", func(t *testing.T) {
		db, _ := mustOpen(t)
		for i := range 3 {
			if err := db.TakeOver(ctx, 3, "a", 2); err != nil {
				t.Fatalf("TakeOver(3, a, 2) #%d = %v, want nil", i+1, err)
			}
		}
		owner(t, db, 3, "a", 2)
		// The same epoch by another server is not a takeover.
		if err := db.TakeOver(ctx, 3, "b", 2); !errors.Is(err, postgres.ErrStaleEpoch) {
			t.Errorf("TakeOver(3, b, 2) = %v, want ErrStaleEpoch", err)
		}
		owner(t, db, 3, "a", 2)
	})

	t.Run("StaleEpoch", func(t *testing.T) {
		db, _ := mustOpen(t)
		if err := db.TakeOver(ctx, 4, "a", 10); err != nil {
			t.Fatalf("TakeOver(4, a, 10) = %v, want nil", err)
		}
		for _, tt := range []struct {
			server string
			epoch  int64
		}{{"a", 9}, {"b", 9}, {"b", 1}, {"a", 0}} {
			if err := db.TakeOver(ctx, 4, tt.server, tt.epoch); !errors.Is(err, postgres.ErrStaleEpoch) {
				t.Errorf("TakeOver(4, %s, %d) = %v, want ErrStaleEpoch", tt.server, tt.epoch, err)
			}
		}
		owner(t, db, 4, "a", 10)
	})

	t.Run("WaitsForShareLock", func(t *testing.T) {
		db, url := mustOpen(t)
		const p = 11
		if err := db.TakeOver(ctx, p, "old", 1); err != nil {
			t.Fatalf("TakeOver(%d, old, 1) = %v, want nil", p, err)
		}
		// A batch of the old owner in flight: it holds the partition row
		// FOR SHARE until it commits.
		conn := connect(t, url)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin = %v", err)
		}
		defer tx.Rollback(ctx)
		var epoch int64
		if err := tx.QueryRow(ctx, `SELECT epoch FROM partitions WHERE partition = $1 FOR SHARE`, p).Scan(&epoch); err != nil || epoch != 1 {
			t.Fatalf("SELECT ... FOR SHARE = %d, %v, want 1, nil", epoch, err)
		}

		done := make(chan error, 1)
		go func() { done <- db.TakeOver(ctx, p, "new", 2) }()
		select {
		case err := <-done:
			t.Fatalf("TakeOver(%d, new, 2) = %v while a batch held the partition FOR SHARE, want it to wait", p, err)
		case <-time.After(100 * time.Millisecond): // under blockerGrace
		}
		// The old owner's batch still sees itself as the owner and commits.
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("Commit = %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("TakeOver(%d, new, 2) = %v, want nil", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("TakeOver(%d, new, 2) did not return within 5s of the batch's commit", p)
		}
		owner(t, db, p, "new", 2)
	})

	// A batch whose server stopped mid-transaction (SIGSTOP, a partition)
	// holds the row FOR SHARE until Postgres ends its session: the takeover
	// ends it instead, and the batch can no longer commit.
	t.Run("EndsAStoppedBatch", func(t *testing.T) {
		db, url := mustOpen(t)
		const p = 12
		if err := db.TakeOver(ctx, p, "old", 1); err != nil {
			t.Fatalf("TakeOver(%d, old, 1) = %v, want nil", p, err)
		}
		conn := connect(t, url)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin = %v", err)
		}
		if _, err := tx.Exec(ctx, `SELECT epoch FROM partitions WHERE partition = $1 FOR SHARE`, p); err != nil {
			t.Fatalf("SELECT ... FOR SHARE = %v", err)
		}
		start := time.Now()
		if err := db.TakeOver(ctx, p, "new", 2); err != nil {
			t.Fatalf("TakeOver(%d, new, 2) = %v, want nil", p, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("TakeOver took %v behind a stopped batch, want it to end the batch at once", d)
		}
		owner(t, db, p, "new", 2)
		if err := tx.Commit(ctx); err == nil {
			t.Errorf("the stopped batch committed after the takeover, want its session ended")
		}
	})
}

// TestDB_Batch drives the batch transaction directly with hand-made writes.
func TestDB_Batch(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	setup := func(t *testing.T, limit int64) (*postgres.DB, *pgx.Conn, stock.ShardKey, stock.Fence) {
		t.Helper()
		db, url := mustOpen(t)
		k := stock.ShardKey{SKU: "b-sku"}
		createSKU(t, db, stock.SKU{Name: k.SKU, Shards: 1, CustomerLimit: limit}, 10)
		f := stock.Fence{Partition: k.Partition(), Epoch: 1, ServerID: "srv"}
		if err := db.TakeOver(ctx, f.Partition, f.ServerID, f.Epoch); err != nil {
			t.Fatalf("TakeOver = %v", err)
		}
		return db, connect(t, url), k, f
	}

	t.Run("Fenced", func(t *testing.T) {
		db, _, k, f := setup(t, 0)
		stale := f
		stale.Epoch = 0
		decided := false
		err := db.Batch(ctx, stale, stock.BatchQuery{Shard: k}, func(*stock.BatchRead) (*stock.BatchWrite, error) {
			decided = true
			return &stock.BatchWrite{}, nil
		})
		if !errors.Is(err, stock.ErrFenced) || decided {
			t.Errorf("Batch(epoch 0 on a partition at 1) = %v (decided %v), want stock.ErrFenced before deciding", err, decided)
		}
	})

	t.Run("UsageGivenBackInSameBatch", func(t *testing.T) {
		// Customer c holds 3 of a limit of 5; one batch gives those 3 back
		// (a release: 7/3/0 -> 10/0/0) and buys 3 (a deduct: -> 7/0/3), as
		// the planner decides it. Net usage is 3, within the limit, so the
		// batch must commit.
		db, conn, k, f := setup(t, 5)
		exec(t, conn, `INSERT INTO customer_usage (sku, customer_ref, quantity) VALUES ($1, 'c', 3)`, k.SKU)
		exec(t, conn, `UPDATE shards SET available = 7, reserved = 3 WHERE sku = $1`, k.SKU)
		from, to := stock.Counts{Available: 7, Reserved: 3}, stock.Counts{Available: 7, Sold: 3}
		err := db.Batch(ctx, f, stock.BatchQuery{Shard: k, Customers: []string{"c"}}, func(read *stock.BatchRead) (*stock.BatchWrite, error) {
			if read.Usage["c"] != 3 {
				t.Errorf("stock.BatchRead.Usage[c] = %d, want 3", read.Usage["c"])
			}
			return &stock.BatchWrite{UsageAdd: map[string]int64{"c": 3}, UsageSub: map[string]int64{"c": 3}, UsageLimit: 5, From: from, To: to}, nil
		})
		if err != nil {
			t.Errorf("Batch(usage -3 +3 at 3 of 5) = %v, want nil", err)
		}
		if n := count(t, conn, `SELECT quantity FROM customer_usage WHERE sku = $1 AND customer_ref = 'c'`, k.SKU); n != 3 {
			t.Errorf("customer_usage[c] = %d, want 3", n)
		}
	})

	t.Run("RefundCap", func(t *testing.T) {
		// A sale of 3. Two refunds of 2 decided from the same read (as two
		// shards' writers may, in two transactions at once): the second
		// to write is refused by the guard on the sale's refunded units, a
		// conflict to rerun, not a success past the sale.
		db, conn, k, f := setup(t, 0)
		exec(t, conn, `UPDATE shards SET available = 0, sold = 10 WHERE sku = $1`, k.SKU)
		refund := func(from stock.Counts) stock.Decide {
			return func(read *stock.BatchRead) (*stock.BatchWrite, error) {
				return &stock.BatchWrite{Refunds: []stock.RefundAdd{{SKU: k.SKU, Sale: "deduct:s", Sold: 3, Quantity: 2}},
					From: from, To: from.Add(stock.OpRefund.Delta(2))}, nil
			}
		}
		q := stock.BatchQuery{Shard: k, Sales: []string{"deduct:s"}}
		if err := db.Batch(ctx, f, q, refund(stock.Counts{Sold: 10})); err != nil {
			t.Fatalf("Batch(refund 2 of 3) = %v", err)
		}
		err := db.Batch(ctx, f, q, refund(stock.Counts{Available: 2, Sold: 8}))
		if !errors.Is(err, stock.ErrConflict) {
			t.Errorf("Batch(refund 2 more of 3) = %v, want stock.ErrConflict", err)
		}
		if n := count(t, conn, `SELECT refunded FROM refunds WHERE sku = $1 AND sale = 'deduct:s'`, k.SKU); n != 2 {
			t.Errorf("refunds[s] = %d, want 2", n)
		}
	})
}

// ownedShards creates sku with 3 shards of 10 units in a database of the
// test's own, each shard's partition owned by server "srv" at epoch 7.
func ownedShards(t *testing.T, sku string) (*postgres.DB, *pgx.Conn, []stock.ShardKey, []stock.Fence) {
	t.Helper()
	db, url := mustOpen(t)
	createSKU(t, db, stock.SKU{Name: sku, Shards: 3}, 30)
	var ks []stock.ShardKey
	var fs []stock.Fence
	for i := int32(0); i < 3; i++ {
		k := stock.ShardKey{SKU: sku, Index: i}
		f := stock.Fence{Partition: k.Partition(), Epoch: 7, ServerID: "srv"}
		if err := db.TakeOver(context.Background(), f.Partition, f.ServerID, f.Epoch); err != nil {
			t.Fatalf("TakeOver = %v", err)
		}
		ks, fs = append(ks, k), append(fs, f)
	}
	return db, connect(t, url), ks, fs
}

// TestDB_Group: many shards' batches in one transaction. A unit with a stale
// fence is left out and the others commit; a key taken twice in one group is
// a conflict of the whole group, which writes nothing.
func TestDB_Group(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	setup := func(t *testing.T) (*postgres.DB, *pgx.Conn, []stock.ShardKey, []stock.Fence) {
		return ownedShards(t, "g-sku")
	}
	deduct := func(k stock.ShardKey, key string) stock.Decide {
		return func(read *stock.BatchRead) (*stock.BatchWrite, error) {
			from := stock.Counts{Available: 10}
			to := from.Add(stock.OpDeduct.Delta(1))
			return &stock.BatchWrite{
				Ops:    []*stock.Operation{{SKU: k.SKU, IdempotencyKey: key, Kind: stock.OpDeduct, Quantity: 1, Shard: k.Index, ParamsHash: []byte{1}}},
				Ledger: []*stock.LedgerEntry{{Shard: k, Kind: stock.OpDeduct, Quantity: 1, IdempotencyKey: key, Before: from, After: to, Source: "api"}},
				From:   from, To: to,
			}, nil
		}
	}

	t.Run("OK", func(t *testing.T) {
		db, conn, ks, fs := setup(t)
		stale := fs[1]
		stale.Epoch = 6
		units := []*stock.Unit{
			{Fence: fs[0], Query: stock.BatchQuery{Shard: ks[0], Keys: []string{"k0"}}, Decide: deduct(ks[0], "k0")},
			{Fence: stale, Query: stock.BatchQuery{Shard: ks[1], Keys: []string{"k1"}}, Decide: deduct(ks[1], "k1")},
			{Fence: fs[2], Query: stock.BatchQuery{Shard: ks[2], Keys: []string{"k2"}}, Decide: deduct(ks[2], "k2")},
		}
		if err := db.Group(ctx, units); err != nil {
			t.Fatalf("Group = %v", err)
		}
		if !errors.Is(units[1].Err, stock.ErrFenced) || units[0].Err != nil || units[2].Err != nil {
			t.Errorf("unit errors = %v, %v, %v; want nil, stock.ErrFenced, nil", units[0].Err, units[1].Err, units[2].Err)
		}
		if n := count(t, conn, `SELECT count(*) FROM operations`); n != 2 {
			t.Errorf("operations = %d, want 2 (the fenced unit wrote nothing)", n)
		}
		if n := count(t, conn, `SELECT count(*) FROM ledger WHERE epoch = 7 AND server_id = 'srv'`); n != 2 {
			t.Errorf("ledger entries at epoch 7 = %d, want 2", n)
		}
		if n := count(t, conn, `SELECT available FROM shards WHERE sku = 'g-sku' AND idx = 1`); n != 10 {
			t.Errorf("fenced shard available = %d, want 10", n)
		}
	})
	t.Run("SameKeyTwice", func(t *testing.T) {
		db, conn, ks, fs := setup(t)
		units := []*stock.Unit{
			{Fence: fs[0], Query: stock.BatchQuery{Shard: ks[0], Keys: []string{"dup"}}, Decide: deduct(ks[0], "dup")},
			{Fence: fs[2], Query: stock.BatchQuery{Shard: ks[2], Keys: []string{"dup"}}, Decide: deduct(ks[2], "dup")},
		}
		if err := db.Group(ctx, units); !errors.Is(err, stock.ErrConflict) {
			t.Errorf("Group with one key on two shards = %v, want stock.ErrConflict", err)
		}
		if n := count(t, conn, `SELECT count(*) FROM operations`); n != 0 {
			t.Errorf("operations = %d, want 0", n)
		}
	})
	// A group's rows are written by one statement: a row count that is not
	// what a unit decided, in any part, must abort it all (every unit's
	// operations, ledger entries, shard rows and the commit mark).
	nothingWritten := func(t *testing.T, conn *pgx.Conn) {
		t.Helper()
		for _, q := range []string{`SELECT count(*) FROM operations`, `SELECT count(*) FROM ledger WHERE source = 'api'`,
			`SELECT count(*) FROM commit_marks`, `SELECT count(*) FROM shards WHERE sku = 'g-sku' AND available <> 10`} {
			if n := count(t, conn, q); n != 0 {
				t.Errorf("%s = %d after an aborted group, want 0", q, n)
			}
		}
	}
	t.Run("DivergedShardWritesNothing", func(t *testing.T) {
		db, conn, ks, fs := setup(t)
		wrong := func(read *stock.BatchRead) (*stock.BatchWrite, error) {
			w, err := deduct(ks[2], "k2")(read)
			w.From.Available = 9 // the row is 10: not what this writer believes
			return w, err
		}
		units := []*stock.Unit{
			{Fence: fs[0], Query: stock.BatchQuery{Shard: ks[0], Keys: []string{"k0"}}, Decide: deduct(ks[0], "k0")},
			{Fence: fs[2], Query: stock.BatchQuery{Shard: ks[2], Keys: []string{"k2"}}, Decide: wrong},
		}
		if err := db.Group(ctx, units); !errors.Is(err, stock.ErrDiverged) {
			t.Errorf("Group with a shard row not as its writer believes = %v, want stock.ErrDiverged", err)
		}
		nothingWritten(t, conn)
	})
	t.Run("EndedTwiceWritesNothing", func(t *testing.T) {
		db, conn, ks, fs := setup(t)
		exec(t, conn, `INSERT INTO reservations (id, sku, shard, partition, idempotency_key, quantity, state, expires_at)
			VALUES ('r-gone', 'g-sku', 0, $1, 'rk', 1, 'released', now())`, fs[0].Partition)
		ending := func(read *stock.BatchRead) (*stock.BatchWrite, error) {
			w, err := deduct(ks[0], "k0")(read)
			w.Ended = []stock.ReservationEnd{{ID: "r-gone", State: stock.ReservationCommitted}}
			return w, err
		}
		units := []*stock.Unit{
			{Fence: fs[0], Query: stock.BatchQuery{Shard: ks[0], Keys: []string{"k0"}}, Decide: ending},
			{Fence: fs[2], Query: stock.BatchQuery{Shard: ks[2], Keys: []string{"k2"}}, Decide: deduct(ks[2], "k2")},
		}
		if err := db.Group(ctx, units); !errors.Is(err, stock.ErrDiverged) {
			t.Errorf("Group ending a reservation no longer held = %v, want stock.ErrDiverged", err)
		}
		nothingWritten(t, conn)
		if n := count(t, conn, `SELECT count(*) FROM reservations WHERE state = 'released'`); n != 1 {
			t.Errorf("released reservations = %d, want the 1 left as it was", n)
		}
	})
}

// With MigrateURL the schema's owner migrates and the service's own role
// may read and append the ledger but not change, remove or truncate an
// entry: permission denied (42501) before the append-only trigger is even
// reached. Everything else the service writes it still may.
func TestLedger_ServiceRoleCannotRewrite(t *testing.T) {
	ownerURL := pgtest.NewDB(t)
	ctx := context.Background()
	owner := connect(t, ownerURL)
	role := fmt.Sprintf("svc_%d", time.Now().UnixNano())
	exec(t, owner, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), ownerURL)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), `DROP OWNED BY `+role)
		c.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	svcURL := u.String()
	db, err := postgres.Open(ctx, svcURL, postgres.Options{MigrateURL: ownerURL, MaxConns: 2})
	if err != nil {
		t.Fatalf("Open as %s, migrated by the owner = %v", role, err)
	}
	t.Cleanup(db.Close)
	createSKU(t, db, stock.SKU{Name: "r-sku", Shards: 1}, 10)
	svc := connect(t, svcURL)
	exec(t, svc, insertLedger, "r-sku", 0, "replenish", 5, 0, 5, 0, 0, 0, 0, "r-key")
	exec(t, svc, `UPDATE shards SET available = available WHERE sku = 'r-sku'`)
	for _, sql := range []string{
		`UPDATE ledger SET quantity = quantity + 1`,
		`DELETE FROM ledger`,
		`TRUNCATE ledger`,
		`DROP TRIGGER IF EXISTS ledger_append_only ON ledger`,
		`ALTER TABLE ledger DISABLE TRIGGER ALL`,
	} {
		_, err := svc.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "42501" && pgErr.Code != "42P01") {
			t.Errorf("as the service's role, %s = %v, want permission denied (42501)", sql, err)
		}
	}
	if n := count(t, owner, `SELECT count(*) FROM ledger WHERE quantity = 5`); n != 1 {
		t.Errorf("ledger rows intact = %d, want 1", n)
	}
}

// TestStockRead_OneSnapshot: while transfers are debited and credited,
// each in its own transaction, every StockRead adds up: what the shards
// hold plus what is in transit is the initial stock.
func TestStockRead_OneSnapshot(t *testing.T) {
	db, url := mustOpen(t)
	const sku, initial, steps = "snap", 1000, 300
	createSKU(t, db, stock.SKU{Name: "snap", Shards: 2}, initial)
	conn := connect(t, url)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for i := range steps {
			id := fmt.Sprintf("t%d", i)
			debit := pgx.Batch{}
			debit.Queue(`UPDATE shards SET available = available - 1 WHERE sku = $1 AND idx = 0`, sku)
			debit.Queue(`INSERT INTO transfers (id, sku, from_shard, to_shard, from_partition, to_partition, quantity, state)
				VALUES ($1, $2, 0, 1, 0, 0, 1, 'debited')`, id, sku)
			credit := pgx.Batch{}
			credit.Queue(`UPDATE shards SET available = available + 1 WHERE sku = $1 AND idx = 1`, sku)
			credit.Queue(`UPDATE transfers SET state = 'credited' WHERE id = $1`, id)
			for _, b := range []*pgx.Batch{&debit, &credit} {
				if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
					t.Errorf("step %s: %v", id, err)
					return
				}
			}
		}
	}()
	reads, wrong := 0, 0
	for running := true; running; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		r, err := db.StockRead(context.Background(), sku, 100)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Totals.Available + r.Totals.Reserved + r.Totals.Sold + r.InTransit; got != initial {
			wrong++
			if wrong == 1 {
				t.Errorf("a read does not add up: totals %+v + in transit %d = %d, want %d", r.Totals, r.InTransit, got, initial)
			}
		}
		var shards int64
		for _, s := range r.Shards {
			shards += s.Available
		}
		if shards != r.Totals.Available {
			wrong++
			if wrong == 1 {
				t.Errorf("shards hold %d, totals say %d", shards, r.Totals.Available)
			}
		}
	}
	t.Logf("%d reads during %d transfers, %d that did not add up", reads, steps, wrong)
}

// TestStockRead_RetiredInTotals: shards past the SKU's span are left out
// of the rows but counted in the totals (their sales happened).
func TestStockRead_RetiredInTotals(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	db, url := mustOpen(t)
	createSKU(t, db, stock.SKU{Name: "retired", Shards: 3}, 30)
	conn := connect(t, url)
	ctx := context.Background()
	// Shard 2 sold its 10 and was retired: the span is back to 2.
	for _, q := range []string{
		`UPDATE shards SET available = 0, sold = 10 WHERE sku = 'retired' AND idx = 2`,
		`UPDATE skus SET shards = 2, shard_span = 2 WHERE sku = 'retired'`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	r, err := db.StockRead(ctx, "retired", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Shards) != 2 || r.Shards[0].Index != 0 || r.Shards[1].Index != 1 {
		t.Errorf("shards = %+v, want 0 and 1 (the span)", r.Shards)
	}
	if want := (stock.Counts{Available: 20, Sold: 10}); r.Totals != want {
		t.Errorf("totals = %+v, want %+v (the retired shard's sales included)", r.Totals, want)
	}
	if rows, err := db.Shards(ctx, "retired"); err != nil || len(rows) != 2 {
		t.Errorf("Shards = %+v, %v; want the 2 in the span", rows, err)
	}
}

// decision records what a test batch's Decide was given, call by call.
type decision struct {
	calls    int
	replayed bool // the last call saw the key recorded
	sku      *stock.SKU
	now      time.Time
}

// deductOne is a Decide for one deduct of key from a shard the writer
// believes at from: a replay when the read holds the key, nothing when the
// SKU is not active or refuse is set (an OUT_OF_STOCK, say), else one unit.
func deductOne(k stock.ShardKey, key string, from stock.Counts, refuse bool, d *decision) stock.Decide {
	return func(read *stock.BatchRead) (*stock.BatchWrite, error) {
		d.calls++
		d.sku, d.now, d.replayed = read.SKU, read.Now, read.Ops[key] != nil
		if d.replayed || read.SKU == nil || read.SKU.Status != stock.StatusActive || refuse {
			return &stock.BatchWrite{From: from, To: from}, nil
		}
		to := from.Add(stock.OpDeduct.Delta(1))
		return &stock.BatchWrite{
			Ops: []*stock.Operation{{SKU: k.SKU, IdempotencyKey: key, Kind: stock.OpDeduct, Quantity: 1, Shard: k.Index,
				ParamsHash: []byte{1}, CreatedAt: read.Now}},
			Ledger: []*stock.LedgerEntry{{Shard: k, Kind: stock.OpDeduct, Quantity: 1, IdempotencyKey: key, Before: from, After: to, Source: "api"}},
			From:   from, To: to,
		}, nil
	}
}

// TestDB_GroupSpeculative: a group of writers that know their SKU, whose
// batches need no read but their keys', is decided before anything is read
// and written in one round trip; when a key is not new, the SKU changed or
// a fence moved, nothing of it is written and the group is decided again
// from what is read, with the same answers as without speculation.
func TestDB_GroupSpeculative(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	ten := stock.Counts{Available: 10}
	setup := func(t *testing.T) (*postgres.DB, *pgx.Conn, []stock.ShardKey, []stock.Fence, *stock.SKU) {
		t.Helper()
		db, conn, ks, fs := ownedShards(t, "s-sku")
		sku, err := db.GetSKU(ctx, "s-sku")
		if err != nil {
			t.Fatal(err)
		}
		return db, conn, ks, fs, sku
	}
	unit := func(f stock.Fence, k stock.ShardKey, key string, known *stock.SKU, decide stock.Decide) *stock.Unit {
		return &stock.Unit{Fence: f, Query: stock.BatchQuery{Shard: k, Keys: []string{key}, KnownSKU: known}, Decide: decide}
	}
	// groupOK runs units as one group, which every unit must commit in.
	groupOK := func(t *testing.T, db *postgres.DB, units []*stock.Unit) {
		t.Helper()
		if err := db.Group(ctx, units); err != nil {
			t.Fatalf("Group = %v, want nil", err)
		}
		for i, u := range units {
			if u.Err != nil {
				t.Fatalf("Group: unit %d = %v, want nil", i, u.Err)
			}
		}
	}
	speculated := func(t *testing.T, db *postgres.DB, committed, fellBack int64) {
		t.Helper()
		if c, f := db.Speculated(); c != committed || f != fellBack {
			t.Errorf("Speculated() = %d committed, %d fell back; want %d and %d", c, f, committed, fellBack)
		}
	}

	t.Run("OneRoundTrip", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		var d0, d1 decision
		units := []*stock.Unit{unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", ten, false, &d0)),
			unit(fs[1], ks[1], "k1", sku, deductOne(ks[1], "k1", ten, false, &d1))}
		groupOK(t, db, units)
		speculated(t, db, 1, 0)
		if d0.calls != 1 || d0.sku != sku {
			t.Errorf("Decide called %d times with SKU %p, want once with the known SKU %p", d0.calls, d0.sku, sku)
		}
		if n := count(t, conn, `SELECT count(*) FROM ledger WHERE source = 'api' AND epoch = 7`); n != 2 {
			t.Errorf("ledger entries = %d, want 2", n)
		}
		if n := count(t, conn, `SELECT sum(available) FROM shards WHERE sku = 's-sku'`); n != 28 {
			t.Errorf("available = %d, want 28", n)
		}
		// The operation's time is the one its first answer gave, to the
		// nanosecond: a replay answers what was stored.
		var created time.Time
		var skew float64
		if err := conn.QueryRow(ctx, `SELECT created_at, abs(extract(epoch FROM created_at - now())) FROM operations WHERE idempotency_key = 'k0'`).
			Scan(&created, &skew); err != nil {
			t.Fatal(err)
		}
		if !created.Equal(d0.now) || skew > 60 {
			t.Errorf("operation created_at = %v (%.1fs from the database's clock), want the answer's %v", created, skew, d0.now)
		}
	})
	t.Run("KeyNotNew", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		var first decision
		if err := db.Group(ctx, []*stock.Unit{unit(fs[0], ks[0], "k0", nil, deductOne(ks[0], "k0", ten, false, &first))}); err != nil {
			t.Fatalf("Group(k0) = %v", err)
		}
		speculated(t, db, 0, 0) // no known SKU: read first
		// k0 again on shard 0 (a retry), k1 new on shard 1: the insert
		// refuses k0, and the group is decided again: k0 a replay.
		var d0, d1 decision
		nine := ten.Add(stock.OpDeduct.Delta(1))
		units := []*stock.Unit{unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", nine, false, &d0)),
			unit(fs[1], ks[1], "k1", sku, deductOne(ks[1], "k1", ten, false, &d1))}
		groupOK(t, db, units)
		speculated(t, db, 0, 1)
		if d0.calls != 2 || !d0.replayed {
			t.Errorf("k0 decided %d times, replayed %v; want twice, the second a replay", d0.calls, d0.replayed)
		}
		if n := count(t, conn, `SELECT count(*) FROM ledger WHERE idempotency_key = 'k0'`); n != 1 {
			t.Errorf("ledger entries of k0 = %d, want 1 (a retry deducts nothing)", n)
		}
		if n := count(t, conn, `SELECT sum(available) FROM shards WHERE sku = 's-sku'`); n != 28 {
			t.Errorf("available = %d, want 28", n)
		}
		// After a key that was not new, the next groups read first.
		var d2 decision
		if err := db.Group(ctx, []*stock.Unit{unit(fs[2], ks[2], "k2", sku, deductOne(ks[2], "k2", ten, false, &d2))}); err != nil {
			t.Fatalf("Group(k2) = %v", err)
		}
		speculated(t, db, 0, 1)
	})
	t.Run("RefusedNotSent", func(t *testing.T) {
		// A refusal decided without the read may be wrong (the key is a
		// replay): such a group is not sent, and the read decides.
		db, _, ks, fs, sku := setup(t)
		var first decision
		if err := db.Group(ctx, []*stock.Unit{unit(fs[0], ks[0], "k0", nil, deductOne(ks[0], "k0", ten, false, &first))}); err != nil {
			t.Fatalf("Group(k0) = %v", err)
		}
		var d decision
		nine := ten.Add(stock.OpDeduct.Delta(1))
		if err := db.Group(ctx, []*stock.Unit{unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", nine, true, &d))}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 0)
		if d.calls != 2 || !d.replayed {
			t.Errorf("k0 decided %d times, replayed %v; want twice, the second a replay", d.calls, d.replayed)
		}
	})
	t.Run("FenceMoved", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		if err := db.TakeOver(ctx, fs[1].Partition, "other", 8); err != nil {
			t.Fatal(err)
		}
		var d0, d1 decision
		units := []*stock.Unit{unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", ten, false, &d0)),
			unit(fs[1], ks[1], "k1", sku, deductOne(ks[1], "k1", ten, false, &d1))}
		if err := db.Group(ctx, units); err != nil {
			t.Fatalf("Group = %v, want nil", err)
		}
		speculated(t, db, 0, 1)
		if units[0].Err != nil || !errors.Is(units[1].Err, stock.ErrFenced) {
			t.Errorf("unit errors = %v, %v; want nil and stock.ErrFenced", units[0].Err, units[1].Err)
		}
		if n := count(t, conn, `SELECT count(*) FROM operations WHERE idempotency_key = 'k1'`); n != 0 {
			t.Errorf("operations of the fenced writer = %d, want 0", n)
		}
	})
	// A takeover waits for a speculative group of the old owner that is in
	// flight, as for any batch: the statement locks the fences FOR SHARE
	// before anything else, and holds them until COMMIT. Here the group
	// waits, after its fences, on a key another transaction is inserting.
	t.Run("TakeoverWaitsForIt", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		other, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Rollback(ctx)
		if _, err := other.Exec(ctx, `INSERT INTO operations (sku, idempotency_key, kind, params_hash, quantity, shard)
			VALUES ('s-sku', 'k0', 'deduct', '\x01', 1, 0)`); err != nil {
			t.Fatal(err)
		}
		var d decision
		group := make(chan error, 1)
		unit0 := unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", ten, false, &d))
		go func() { group <- db.Group(ctx, []*stock.Unit{unit0}) }()
		// Watched from a connection of its own: within a transaction,
		// pg_stat_activity is a snapshot taken at its first read.
		watch := connect(t, conn.Config().ConnString())
		for deadline := time.Now().Add(5 * time.Second); count(t, watch, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH fenced%'`) != 1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the speculative group never waited on the key")
			}
		}
		takeover := make(chan error, 1)
		go func() { takeover <- db.TakeOver(ctx, fs[0].Partition, "other", 8) }()
		select {
		case err := <-takeover:
			t.Fatalf("TakeOver = %v while a speculative group of the old owner was in flight, want it to wait", err)
		case <-time.After(100 * time.Millisecond): // under blockerGrace
		}
		if err := other.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-group; err != nil || unit0.Err != nil {
			t.Fatalf("Group = %v (unit %v), want the group committed before the takeover", err, unit0.Err)
		}
		if err := <-takeover; err != nil {
			t.Fatalf("TakeOver = %v", err)
		}
		speculated(t, db, 1, 0)
		if o, e, err := db.PartitionOwner(ctx, fs[0].Partition); err != nil || o != "other" || e != 8 {
			t.Errorf("PartitionOwner = %s@%d, %v; want other@8", o, e, err)
		}
	})
	t.Run("SKUChanged", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		paused := true
		if _, err := db.UpdateSKU(ctx, "s-sku", stock.SKUUpdate{Paused: &paused}); err != nil {
			t.Fatal(err)
		}
		var d decision
		if err := db.Group(ctx, []*stock.Unit{unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", ten, false, &d))}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 1)
		if d.calls != 2 || d.sku == nil || d.sku.Status != stock.StatusPaused {
			t.Errorf("decided %d times, last with SKU %+v; want twice, the second with the paused SKU", d.calls, d.sku)
		}
		if n := count(t, conn, `SELECT count(*) FROM operations`); n != 0 {
			t.Errorf("operations = %d on a paused SKU, want 0", n)
		}
	})
	// The check is the SKU row's version, which any change of the row
	// moves: an update of a column no setting of the old check named
	// (updated_at) makes the group decide again too.
	t.Run("SKUTouched", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		exec(t, conn, `UPDATE skus SET updated_at = updated_at WHERE sku = 's-sku'`)
		var d decision
		if err := db.Group(ctx, []*stock.Unit{unit(fs[0], ks[0], "k0", sku, deductOne(ks[0], "k0", ten, false, &d))}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 1)
		if d.calls != 2 || d.sku == nil || d.sku.Version == sku.Version {
			t.Errorf("decided %d times, last with SKU %+v; want twice, the second with the SKU's new version (not %d)", d.calls, d.sku, sku.Version)
		}
	})
	// Two writers of one SKU in a group may hold reads from either side of
	// a change: the older read fails the check though the newer one
	// matches, and both are decided again from what is read.
	t.Run("SKUReadsApart", func(t *testing.T) {
		db, _, ks, fs, before := setup(t)
		limit := int64(5)
		after, err := db.UpdateSKU(ctx, "s-sku", stock.SKUUpdate{MaxPerOrder: &limit})
		if err != nil || after.Version == before.Version {
			t.Fatalf("UpdateSKU = %+v, %v; want a new version", after, err)
		}
		var d0, d1 decision
		units := []*stock.Unit{unit(fs[0], ks[0], "k0", after, deductOne(ks[0], "k0", ten, false, &d0)),
			unit(fs[1], ks[1], "k1", before, deductOne(ks[1], "k1", ten, false, &d1))}
		groupOK(t, db, units)
		speculated(t, db, 0, 1)
		if d1.calls != 2 || d1.sku == nil || d1.sku.MaxPerOrder != limit {
			t.Errorf("the unit with the older read decided %d times, last with SKU %+v; want twice, the second with max_per_order %d", d1.calls, d1.sku, limit)
		}
	})
	// A SKU not read from storage (version 0) is never speculated on: the
	// group reads first.
	t.Run("SKUNotRead", func(t *testing.T) {
		db, _, ks, fs, sku := setup(t)
		unread := *sku
		unread.Version = 0
		var d decision
		if err := db.Group(ctx, []*stock.Unit{unit(fs[0], ks[0], "k0", &unread, deductOne(ks[0], "k0", ten, false, &d))}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 0)
		if d.calls != 1 || d.sku == nil || d.sku.Version != sku.Version {
			t.Errorf("decided %d times with SKU %+v; want once, from the SKU read (version %d)", d.calls, d.sku, sku.Version)
		}
	})
	// A writer started from a seed (a sibling's read of its row) decides
	// from it only in a speculative group, whose write compares the row:
	// a stale seed, or a halt the seed does not show, writes nothing
	// speculatively, and the group decides again from the row it reads.
	seeded := func(f stock.Fence, k stock.ShardKey, key string, known *stock.SKU, seed stock.Counts, d *seedDecision) *stock.Unit {
		u := unit(f, k, key, known, d.decide(k, key, seed))
		u.Query.Seeded = true
		return u
	}
	haltShard0 := func(t *testing.T, conn *pgx.Conn) {
		t.Helper()
		if _, err := conn.Exec(ctx, `UPDATE shards SET halted_reason = 'test: halted' WHERE sku = 's-sku' AND idx = 0`); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("SeedFresh", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		var d seedDecision
		if err := db.Group(ctx, []*stock.Unit{seeded(fs[0], ks[0], "k0", sku, ten, &d)}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 1, 0)
		if d.calls != 1 || d.shardRead {
			t.Errorf("decided %d times, the last from the row read: %v; want once, from the seed", d.calls, d.shardRead)
		}
		if n := count(t, conn, `SELECT available FROM shards WHERE sku = 's-sku' AND idx = 0`); n != 9 {
			t.Errorf("available = %d, want 9", n)
		}
	})
	t.Run("SeedStale", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		var d seedDecision
		stale := stock.Counts{Available: 4}
		if err := db.Group(ctx, []*stock.Unit{seeded(fs[0], ks[0], "k0", sku, stale, &d)}); err != nil {
			t.Fatalf("Group = %v, want nil (the row read, not the stale seed)", err)
		}
		speculated(t, db, 0, 1)
		if d.calls != 2 || !d.shardRead {
			t.Errorf("decided %d times, the last from the row read: %v; want twice, the second from the row", d.calls, d.shardRead)
		}
		if n := count(t, conn, `SELECT available FROM shards WHERE sku = 's-sku' AND idx = 0`); n != 9 {
			t.Errorf("available = %d, want 9", n)
		}
	})
	t.Run("SeedOfHaltedShard", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		haltShard0(t, conn)
		var d seedDecision
		// The seed's counts are the row's: only the halt differs.
		if err := db.Group(ctx, []*stock.Unit{seeded(fs[0], ks[0], "k0", sku, ten, &d)}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 1)
		if d.halt != "test: halted" {
			t.Errorf("the last decision saw halt %q, want the row's", d.halt)
		}
		if n := count(t, conn, `SELECT count(*) FROM ledger WHERE kind = 'deduct'`); n != 0 {
			t.Errorf("deducts in the ledger = %d after a seeded write to a halted shard, want 0", n)
		}
		if n := count(t, conn, `SELECT available FROM shards WHERE sku = 's-sku' AND idx = 0`); n != 10 {
			t.Errorf("available of the halted shard = %d, want 10", n)
		}
	})
	// A first batch that nets to nothing (a replenish and an adjust that
	// cancel) moves no counts, yet its ledger entries start from the
	// seed: its row must be checked all the same.
	netZero := func(f stock.Fence, k stock.ShardKey, known *stock.SKU, seed stock.Counts, d *seedDecision) *stock.Unit {
		u := unit(f, k, "nz-add", known, func(read *stock.BatchRead) (*stock.BatchWrite, error) {
			at := d.from(read, seed)
			if at == nil {
				return &stock.BatchWrite{}, nil
			}
			from := *at
			mid := from.Add(stock.OpReplenish.Delta(1))
			return &stock.BatchWrite{
				Ops: []*stock.Operation{
					{SKU: k.SKU, IdempotencyKey: "nz-add", Kind: stock.OpReplenish, Quantity: 1, Shard: k.Index, ParamsHash: []byte{1}, CreatedAt: read.Now},
					{SKU: k.SKU, IdempotencyKey: "nz-sub", Kind: stock.OpAdjust, Quantity: -1, Shard: k.Index, ParamsHash: []byte{1}, CreatedAt: read.Now}},
				Ledger: []*stock.LedgerEntry{
					{Shard: k, Kind: stock.OpReplenish, Quantity: 1, IdempotencyKey: "nz-add", Before: from, After: mid, Source: "api"},
					{Shard: k, Kind: stock.OpAdjust, Quantity: -1, IdempotencyKey: "nz-sub", Before: mid, After: from, Source: "api"}},
				From: from, To: from,
			}, nil
		})
		u.Query.Keys = []string{"nz-add", "nz-sub"}
		u.Query.Seeded = true
		return u
	}
	t.Run("SeedStaleNetZero", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		var d seedDecision
		if err := db.Group(ctx, []*stock.Unit{netZero(fs[0], ks[0], sku, stock.Counts{Available: 4}, &d)}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 1)
		if n := count(t, conn, `SELECT count(*) FROM ledger WHERE available_before <> 10 AND kind = 'replenish'`); n != 0 {
			t.Errorf("%d ledger entries start from the stale seed (4), not the row (10)", n)
		}
	})
	t.Run("SeedOfHaltedShardNetZero", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		haltShard0(t, conn)
		var d seedDecision
		if err := db.Group(ctx, []*stock.Unit{netZero(fs[0], ks[0], sku, ten, &d)}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 1)
		if n := count(t, conn, `SELECT count(*) FROM ledger`); n != 0 {
			t.Errorf("ledger entries = %d after a seeded write to a halted shard, want 0", n)
		}
	})
	// A writer with no copy of its row yet (a cold SKU's first batch) does
	// not keep its group from speculating: its SKU and its SKU's rows are
	// read first, outside the transaction, and it decides from them as from
	// a seed, whose row the write compares.
	loading := func(u *stock.Unit) *stock.Unit {
		u.Query.KnownSKU, u.Query.Seeded, u.Query.LoadShard = nil, false, true
		return u
	}
	// changedOnce runs sql (another writer, an operator) when u is first
	// decided: after the read its decision starts from.
	changedOnce := func(t *testing.T, conn *pgx.Conn, u *stock.Unit, sql string) *stock.Unit {
		decide, done := u.Decide, false
		u.Decide = func(read *stock.BatchRead) (*stock.BatchWrite, error) {
			if !done {
				done = true
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Error(err)
				}
			}
			return decide(read)
		}
		return u
	}
	t.Run("LoadFirst", func(t *testing.T) {
		db, conn, ks, fs, sku := setup(t)
		var d0, d1 seedDecision
		units := []*stock.Unit{loading(seeded(fs[0], ks[0], "k0", nil, stock.Counts{}, &d0)), seeded(fs[1], ks[1], "k1", sku, ten, &d1)}
		groupOK(t, db, units)
		speculated(t, db, 1, 0)
		if d0.calls != 1 || !d0.shardRead {
			t.Errorf("decided %d times, from the row read: %v; want once, from the row read first", d0.calls, d0.shardRead)
		}
		if n := count(t, conn, `SELECT sum(available) FROM shards WHERE sku = 's-sku'`); n != 28 {
			t.Errorf("available = %d, want 28", n)
		}
	})
	t.Run("LoadFirstRowChanged", func(t *testing.T) {
		db, conn, ks, fs, _ := setup(t)
		var d seedDecision
		u := changedOnce(t, conn, loading(seeded(fs[0], ks[0], "k0", nil, stock.Counts{}, &d)),
			`UPDATE shards SET available = 7 WHERE sku = 's-sku' AND idx = 0`)
		if err := db.Group(ctx, []*stock.Unit{u}); err != nil || u.Err != nil {
			t.Fatalf("Group = %v (unit %v), want nil", err, u.Err)
		}
		speculated(t, db, 0, 1)
		if d.calls != 2 || !d.shardRead {
			t.Errorf("decided %d times; want twice, the second from the row read in the transaction", d.calls)
		}
		if n := count(t, conn, `SELECT available_before FROM ledger WHERE idempotency_key = 'k0'`); n != 7 {
			t.Errorf("the deduct's entry starts from %d, want the row's 7", n)
		}
	})
	t.Run("LoadFirstRowChangedNetZero", func(t *testing.T) {
		db, conn, ks, fs, _ := setup(t)
		var d seedDecision
		u := changedOnce(t, conn, loading(netZero(fs[0], ks[0], nil, stock.Counts{}, &d)),
			`UPDATE shards SET available = 5 WHERE sku = 's-sku' AND idx = 0`)
		if err := db.Group(ctx, []*stock.Unit{u}); err != nil || u.Err != nil {
			t.Fatalf("Group = %v (unit %v), want nil", err, u.Err)
		}
		speculated(t, db, 0, 1)
		if n := count(t, conn, `SELECT count(*) FROM ledger WHERE available_before <> 5 AND kind = 'replenish'`); n != 0 {
			t.Errorf("%d ledger entries start from the row as read first (10), not as it was at the write (5)", n)
		}
	})
	t.Run("LoadFirstHalted", func(t *testing.T) {
		db, conn, ks, fs, _ := setup(t)
		haltShard0(t, conn)
		var d seedDecision
		u := loading(seeded(fs[0], ks[0], "k0", nil, stock.Counts{}, &d))
		if err := db.Group(ctx, []*stock.Unit{u}); err != nil {
			t.Fatalf("Group = %v", err)
		}
		speculated(t, db, 0, 0) // not sent: a halted row is decided in a transaction
		if d.calls != 1 || d.halt != "test: halted" {
			t.Errorf("decided %d times, the last seeing halt %q; want once, with the row's", d.calls, d.halt)
		}
		if n := count(t, conn, `SELECT count(*) FROM ledger`); n != 0 {
			t.Errorf("ledger entries = %d after a write to a halted shard, want 0", n)
		}
	})
}

// TestDB_GroupLoadsSiblings: a unit that loads its row also gets the SKU's
// other shards that are not halted, as seeds for their writers.
func TestDB_GroupLoadsSiblings(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	db, conn, ks, fs := ownedShards(t, "l-sku")
	if _, err := conn.Exec(ctx, `UPDATE shards SET halted_reason = 'test: halted' WHERE sku = 'l-sku' AND idx = 2`); err != nil {
		t.Fatal(err)
	}
	var got *stock.BatchRead
	u := &stock.Unit{Fence: fs[0], Query: stock.BatchQuery{Shard: ks[0], LoadShard: true}, Decide: func(read *stock.BatchRead) (*stock.BatchWrite, error) {
		got = read
		return &stock.BatchWrite{}, nil
	}}
	if err := db.Group(ctx, []*stock.Unit{u}); err != nil || u.Err != nil {
		t.Fatalf("Group = %v, %v", err, u.Err)
	}
	if !got.ShardRead || got.Counts == nil || *got.Counts != (stock.Counts{Available: 10}) {
		t.Fatalf("read: ShardRead %v, Counts %v; want the row (10 available)", got.ShardRead, got.Counts)
	}
	want := []stock.ShardRow{{Index: 1, Counts: stock.Counts{Available: 10}}}
	if !reflect.DeepEqual(got.Siblings, want) {
		t.Errorf("Siblings = %+v, want %+v (shard 2 is halted)", got.Siblings, want)
	}
}

// seedDecision is a Decide of one deduct by a writer that starts from a
// seed: from the row instead when the group read it, nothing when the
// row is halted; it records what its last call saw.
type seedDecision struct {
	calls     int
	shardRead bool
	halt      string
}

func (d *seedDecision) decide(k stock.ShardKey, key string, seed stock.Counts) stock.Decide {
	return func(read *stock.BatchRead) (*stock.BatchWrite, error) {
		from := d.from(read, seed)
		if from == nil {
			return &stock.BatchWrite{}, nil
		}
		return deductOne(k, key, *from, false, &decision{})(read)
	}
}

// from records a decision and returns the counts it starts from: the row
// read, else the seed; nil when the read found no row, or a halt.
func (d *seedDecision) from(read *stock.BatchRead, seed stock.Counts) *stock.Counts {
	d.calls++
	d.shardRead, d.halt = read.ShardRead, read.HaltReason
	switch {
	case !read.ShardRead:
		return &seed
	case read.Counts == nil || read.HaltReason != "":
		return nil
	}
	return read.Counts
}

// A SKU's version (migration 00023) moves at every update of its row,
// whichever column changes, to a number drawn anew: a speculative group
// that finds the version its writer read finds the settings it read.
func TestDB_SKUVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, url := mustOpen(t)
	conn := connect(t, url)
	createSKU(t, db, stock.SKU{Name: "v-sku", Shards: 2}, 10)
	createSKU(t, db, stock.SKU{Name: "v-other", Shards: 2}, 10)
	version := func() int64 { return count(t, conn, `SELECT version FROM skus WHERE sku = 'v-sku'`) }
	seen := map[int64]string{count(t, conn, `SELECT version FROM skus WHERE sku = 'v-other'`): "v-other's"}
	v := version()
	if v == 0 {
		t.Fatalf("a new SKU's version = 0, want one drawn (sku_version_draw)")
	}
	if s, err := db.GetSKU(ctx, "v-sku"); err != nil || s.Version != v {
		t.Fatalf("GetSKU = %+v, %v; want version %d", s, err, v)
	}
	seen[v] = "created"
	rows, err := conn.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'skus' AND column_name <> 'version' ORDER BY ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(cols) < 10 {
		t.Fatalf("skus columns = %v, %v", cols, err)
	}
	for _, col := range cols {
		c := pgx.Identifier{col}.Sanitize()
		exec(t, conn, `UPDATE skus SET `+c+` = `+c+` WHERE sku = 'v-sku'`)
		nv := version()
		if by, ok := seen[nv]; ok {
			t.Errorf("after an update of %s the version is %d, as %s: want a new one", col, nv, by)
		}
		seen[nv] = "the update of " + col
	}
	paused := true
	s, err := db.UpdateSKU(ctx, "v-sku", stock.SKUUpdate{Paused: &paused})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := seen[s.Version]; ok || s.Version != version() {
		t.Errorf("UpdateSKU answered version %d (stored %d), want a new one, as stored", s.Version, version())
	}
}
