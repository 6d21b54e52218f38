package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

func TestMain(m *testing.M) { Main(m) }

// TestNewDB runs the same checks on both ways of finding a server.
func TestNewDB(t *testing.T) {
	t.Run("Cluster", func(t *testing.T) {
		t.Setenv(envURL, "") // empty counts as unset: use the throwaway cluster
		testNewDB(t)
	})
	t.Run("DatabaseURL", func(t *testing.T) {
		if os.Getenv(envURL) == "" {
			// No server given (CI gives one): point DATABASE_URL at the
			// shared cluster so this path runs everywhere.
			server, err := serverURL()
			if err != nil {
				t.Fatal(err)
			}
			t.Setenv(envURL, server)
		}
		testNewDB(t)
	})
}

// testNewDB checks NewDB against whichever server the environment selects.
func testNewDB(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		dbURL := NewDB(t)
		conn := connect(t, dbURL)
		var got string
		scanOne(t, conn, &got, "SELECT current_database()")
		if want := databaseOf(t, dbURL); got != want {
			t.Fatalf("current_database() = %q, want %q", got, want)
		}
		var relations int
		scanOne(t, conn, &relations, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'`)
		if relations != 0 {
			t.Fatalf("user relations in new database = %d, want 0", relations)
		}
		execSQL(t, conn, "CREATE TABLE t (n int); INSERT INTO t VALUES (1), (2)")
		var sum int
		scanOne(t, conn, &sum, "SELECT sum(n) FROM t")
		if sum != 3 {
			t.Fatalf("sum after insert = %d, want 3", sum)
		}
	})
	t.Run("Unique", func(t *testing.T) {
		a, b := NewDB(t), NewDB(t)
		if databaseOf(t, a) == databaseOf(t, b) {
			t.Fatalf("NewDB twice = %q and %q, want different databases", a, b)
		}
	})
	t.Run("DroppedWithOpenSession", func(t *testing.T) {
		var name string
		var open *pgx.Conn
		t.Run("Use", func(t *testing.T) {
			dbURL := NewDB(t)
			name = databaseOf(t, dbURL)
			// Not connect: its cleanup would close the session before
			// NewDB's cleanup drops the database.
			var err error
			if open, err = pgx.Connect(context.Background(), dbURL); err != nil {
				t.Fatalf("Connect(%s) = %v", dbURL, err)
			}
		})
		if open == nil {
			t.FailNow()
		}
		defer open.Close(context.Background())
		server, err := serverURL()
		if err != nil {
			t.Fatal(err)
		}
		var exists bool
		scanOne(t, connect(t, server), &exists, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name)
		if exists {
			t.Fatalf("database %s exists after cleanup, want dropped", name)
		}
	})
}

// TestNewMigratedDB: each test gets a database of its own that holds the
// whole schema, so that postgres.Open has nothing left to migrate, copied
// from one template per server that no session may open.
func TestNewMigratedDB(t *testing.T) {
	ctx := context.Background()
	a, b := NewMigratedDB(t), NewMigratedDB(t)
	if databaseOf(t, a) == databaseOf(t, b) {
		t.Fatalf("NewMigratedDB twice = %q and %q, want different databases", a, b)
	}
	connA, connB := connect(t, a), connect(t, b)
	var versions, partitions int
	scanOne(t, connA, &versions, "SELECT count(*) FROM goose_db_version")
	scanOne(t, connA, &partitions, "SELECT count(*) FROM partitions")
	if partitions != stock.Partitions {
		t.Fatalf("partitions rows in a migrated database = %d, want %d", partitions, stock.Partitions)
	}
	db, err := postgres.Open(ctx, a, postgres.Options{MaxConns: 1})
	if err != nil {
		t.Fatalf("postgres.Open(%s) = %v", a, err)
	}
	db.Close()
	var after int
	scanOne(t, connA, &after, "SELECT count(*) FROM goose_db_version")
	if after != versions {
		t.Errorf("goose_db_version rows after Open = %d, want %d (nothing left to migrate)", after, versions)
	}
	// Copies, not one database: a change to one is not in the other.
	execSQL(t, connA, "DELETE FROM partitions WHERE partition = 0")
	scanOne(t, connB, &partitions, "SELECT count(*) FROM partitions")
	if partitions != stock.Partitions {
		t.Errorf("partitions rows in b after a deletion in a = %d, want %d", partitions, stock.Partitions)
	}
	server, err := serverURL()
	if err != nil {
		t.Fatal(err)
	}
	name, err := migratedTemplate(server)
	if err != nil {
		t.Fatal(err)
	}
	var allowConn bool
	scanOne(t, connect(t, server), &allowConn, "SELECT datallowconn FROM pg_database WHERE datname = $1", name)
	if allowConn {
		t.Errorf("template %s allows connections, want none (a session on it would stall every copy)", name)
	}
}

// TestServerURL_Room checks that DATABASE_URL's server is used only while
// it has room for a test binary's connections, on a cluster of few
// connections whose free ones the test takes one by one.
func TestServerURL_Room(t *testing.T) {
	const maxConns = 10
	ctx := context.Background()
	c, err := pgcluster.StartMaxConns(ctx, "", maxConns)
	if err != nil {
		t.Fatalf("StartMaxConns(max_connections %d) = %v", maxConns, err)
	}
	t.Cleanup(func() { c.Stop() })
	var reserved int
	first := connect(t, c.URL())
	scanOne(t, first, &reserved, "SELECT current_setting('superuser_reserved_connections')::int")
	free := maxConns - reserved - 1 // less the connection above

	if ok, why, err := hasRoom(c.URL(), free); !ok || err != nil {
		t.Fatalf("hasRoom(%d free, want %d) = %v, %q, %v; want true", free, free, ok, why, err)
	}
	connect(t, c.URL())
	// hasRoom's own session has closed, but its backend may still be
	// exiting (under load, it was counted): wait for the test's two alone.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var backends int
		scanOne(t, first, &backends, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
		if backends == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client backends = %d 10 s after hasRoom's session closed, want the test's 2", backends)
		}
	}
	ok, why, err := hasRoom(c.URL(), free)
	if want := fmt.Sprintf("has %d free connections, fewer than the %d", free-1, free); ok || err != nil || !strings.Contains(why, want) {
		t.Fatalf("hasRoom(%d free, want %d) = %v, %q, %v; want false, %q", free-1, free, ok, why, err, want)
	}
	// The superuser may take the reserved connections too: take them all.
	for range maxConns - 2 {
		connect(t, c.URL())
	}
	ok, why, err = hasRoom(c.URL(), 1)
	if want := "too many clients"; ok || err != nil || !strings.Contains(why, want) {
		t.Fatalf("hasRoom(full server) = %v, %q, %v; want false, %q", ok, why, err, want)
	}

	// NewDB's choice: a server short of room gives way to the throwaway
	// cluster.
	t.Setenv(envURL, c.URL())
	got, err := serverURL()
	if err != nil {
		t.Fatalf("serverURL() = %v", err)
	}
	want, err := clusterURL()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("serverURL() with %s on a full server = %s, want the throwaway cluster %s", envURL, got, want)
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct {
		server, want string
	}{
		{"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "postgres://postgres@127.0.0.1:5432/db1?sslmode=disable"},
		{"postgresql://u:p@h", "postgresql://u:p@h/db1"},
		{"host=h dbname=postgres", ""},
		{"mysql://h/db", ""},
	}
	for _, tt := range tests {
		got, err := withDatabase(tt.server, "db1")
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tt.server, got, err, tt.want)
		}
	}
}

// connect opens a connection closed at the end of the test.
func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("Connect(%s) = %v", dbURL, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// execSQL runs statements that return no rows.
func execSQL(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scanOne runs a query returning one value into dst.
func scanOne(t *testing.T, conn *pgx.Conn, dst any, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.QueryRow(ctx, sql, args...).Scan(dst); err != nil {
		t.Fatalf("%s: %v", strings.Join(strings.Fields(sql), " "), err)
	}
}

// databaseOf returns the database name in a connection URL.
func databaseOf(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}
