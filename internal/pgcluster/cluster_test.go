package pgcluster

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/cmdtest"
)

// TestStart checks the cluster used by pgtest.NewDB and by `make run`.
func TestStart(t *testing.T) {
	t.Run("TempDir", func(t *testing.T) {
		t.Parallel() // clusters of their own: directories, ports, processes
		c := startCluster(t, "")
		var one int
		scanOne(t, connect(t, c.URL()), &one, "SELECT 1")
		dir := c.dir
		if err := c.Stop(); err != nil {
			t.Fatalf("Stop() = %v, want nil", err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("Stat(%s) after Stop = %v, want not exist", dir, err)
		}
		if conn, err := pgx.Connect(context.Background(), c.URL()); err == nil {
			conn.Close(context.Background())
			t.Fatalf("Connect after Stop = nil error, want refused")
		}
		if err := c.Stop(); err != nil {
			t.Fatalf("second Stop() = %v, want nil", err)
		}
	})
	t.Run("CrashRestart", func(t *testing.T) {
		t.Parallel() // clusters of their own: directories, ports, processes
		c := startCluster(t, "")
		conn := connect(t, c.URL())
		execSQL(t, conn, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
		if err := c.Crash(); err != nil {
			t.Fatalf("Crash() = %v, want nil", err)
		}
		if err := c.Restart(context.Background()); err != nil {
			t.Fatalf("Restart() after Crash = %v, want nil", err)
		}
		var n int
		scanOne(t, connect(t, c.URL()), &n, "SELECT n FROM kept")
		if n != 1 {
			t.Fatalf("SELECT n FROM kept after crash recovery = %d, want 1", n)
		}
		if err := c.Stop(); err != nil {
			t.Fatalf("Stop() after Restart = %v, want nil", err)
		}
	})
	t.Run("ReuseDir", func(t *testing.T) {
		t.Parallel() // clusters of their own: directories, ports, processes
		// Not t.TempDir: its 0700 parents would lock out the postgres user,
		// which needs to search every parent of the cluster directory.
		parent, err := os.MkdirTemp("", "pgcluster-reuse-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(parent) })
		if err := os.Chmod(parent, 0o755); err != nil { // let postgres reach dev/
			t.Fatal(err)
		}
		dir := filepath.Join(parent, "dev") // Start creates missing dirs

		first := startCluster(t, dir)
		execSQL(t, connect(t, first.URL()), "CREATE TABLE kept (n int)")
		if err := first.Stop(); err != nil {
			t.Fatalf("Stop() = %v, want nil", err)
		}
		second := startCluster(t, dir)
		var kept string
		scanOne(t, connect(t, second.URL()), &kept, "SELECT to_regclass('kept')::text")
		if kept != "kept" {
			t.Fatalf("to_regclass('kept') after restart = %q, want %q", kept, "kept")
		}
	})
}

// startCluster starts a cluster in dir, stopped at the end of the test.
func startCluster(t *testing.T, dir string) *Cluster {
	t.Helper()
	c, err := Start(context.Background(), dir)
	if err != nil {
		t.Fatalf("Start(%q) = %v", dir, err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
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

// TestStartTLS: a cluster started with TLS answers only TLS connections,
// and its URL verifies the server's certificate, also after a crash.
func TestStartTLS(t *testing.T) {
	ca := cmdtest.NewCA(t)
	cert, key := ca.Issue(t, "postgres")
	c, err := StartTLS(context.Background(), "", TLS{CertFile: cert, KeyFile: key, CAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	if !strings.Contains(c.URL(), "sslmode=verify-full") {
		t.Fatalf("URL() = %s, want sslmode=verify-full", c.URL())
	}
	var ssl bool
	scanOne(t, connect(t, c.URL()), &ssl, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
	if !ssl {
		t.Fatal("the connection of URL() is not TLS")
	}
	refused := func(what, u string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: connected, want refused", what)
			return
		}
		t.Logf("%s: %v", what, err)
	}
	refused("cleartext", strings.Replace(c.URL(), "sslmode=verify-full", "sslmode=disable", 1))
	other := cmdtest.NewCA(t)
	refused("a CA that did not sign the server", strings.Replace(c.URL(), url.QueryEscape(ca.File), url.QueryEscape(other.File), 1))

	if err := c.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	scanOne(t, connect(t, c.URL()), &ssl, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
	if !ssl {
		t.Fatal("after a restart the connection of URL() is not TLS")
	}
	refused("cleartext after a restart", strings.Replace(c.URL(), "sslmode=verify-full", "sslmode=disable", 1))
}
