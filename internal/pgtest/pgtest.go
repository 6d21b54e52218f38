// Package pgtest gives each test a brand-new Postgres database: an empty
// one (NewDB), or one that holds shardstock's schema (NewMigratedDB).
//
// With DATABASE_URL set (CI: postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable,
// trust auth) databases are created on that server, if it has room for a
// test binary's connections (serverConnsMin free ones). Otherwise the first
// NewDB in a test binary starts one throwaway cluster (internal/pgcluster)
// from the local Postgres binaries, shared by the whole binary.
//
// Every package that calls NewDB must stop that cluster when its tests end:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/proccpu"
)

const (
	// envURL names the variable holding the server to create databases on.
	envURL = "DATABASE_URL"
	// queryTimeout bounds each CREATE or DROP DATABASE, connection included.
	queryTimeout = 30 * time.Second
	// migrateTimeout bounds migrating a template: every migration from
	// empty, on a server that other test binaries load.
	migrateTimeout = 2 * time.Minute
	// templateClosePoll is how often a new template is checked for
	// sessions still exiting.
	templateClosePoll = 20 * time.Millisecond
	// dbNamePrefix marks databases made here, so leftovers are easy to spot.
	dbNamePrefix = "pgtest"
	// serverConnsMin is how many free connections DATABASE_URL's server
	// must have for a test binary to use it. The most one binary holds at
	// once is internal/e2e's `make run`: 3 shard servers with 16 each and
	// an allocator with 8 (internal/cmd/devcmd), 56, plus the test's own
	// and pgtest's; the rest is slack for backends that are still exiting.
	serverConnsMin = 64
	// sqlState of Postgres's "sorry, too many clients already".
	tooManyConnections = "53300"
)

var (
	// mainRunning is set by Main; NewDB refuses to run without it so that
	// no package forgets to stop the shared cluster.
	mainRunning atomic.Bool
	// dbCounter makes database names unique within this process.
	dbCounter atomic.Uint64
	// shared is the throwaway cluster of this test binary.
	shared struct {
		once    sync.Once
		cluster *pgcluster.Cluster
		err     error
	}
	// checked holds, by DATABASE_URL, whether its server had room when
	// this binary first looked: one look (and one note) per binary.
	checked struct {
		mu   sync.Mutex
		room map[string]bool
	}
	// templates holds, by server URL, the migrated template database of
	// this test binary on that server (see NewMigratedDB).
	templates struct {
		mu    sync.Mutex
		byURL map[string]*template
	}
)

// template is one server's migrated database that NewMigratedDB copies.
type template struct {
	once sync.Once
	name string // set once created, even if migrating it failed: Main drops it
	err  error
}

// Main runs the tests and then stops the throwaway cluster, if one was
// started, and exits with the tests' status. Call it from TestMain.
func Main(m *testing.M) {
	mainRunning.Store(true)
	code := m.Run()
	dropTemplates()
	if shared.cluster != nil {
		if err := shared.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// NewDB creates an empty database for this test and returns its connection
// URL. The database is dropped, with any sessions still connected, in
// tb.Cleanup.
func NewDB(tb testing.TB) string {
	tb.Helper()
	if !mainRunning.Load() {
		tb.Fatal("pgtest: NewDB needs TestMain to call pgtest.Main: func TestMain(m *testing.M) { pgtest.Main(m) }")
	}
	server, err := serverURL()
	if err != nil {
		tb.Fatal(err)
	}
	return newDB(tb, server, "template0")
}

// NewMigratedDB creates a database for this test that holds shardstock's
// schema, every migration applied, and returns its URL; it is dropped in
// tb.Cleanup as NewDB's is. postgres.Open on it has nothing left to
// migrate.
//
// The database is a copy (CREATE DATABASE ... TEMPLATE) of a template that
// the first call in the test binary migrates, once per server: copying a
// small schema takes a fraction of running every migration again for
// every test (docs/bench-log/2026-12-05-testtime2.md).
func NewMigratedDB(tb testing.TB) string {
	tb.Helper()
	if !mainRunning.Load() {
		tb.Fatal("pgtest: NewMigratedDB needs TestMain to call pgtest.Main: func TestMain(m *testing.M) { pgtest.Main(m) }")
	}
	server, err := serverURL()
	if err != nil {
		tb.Fatal(err)
	}
	name, err := migratedTemplate(server)
	if err != nil {
		tb.Fatal(err)
	}
	return newDB(tb, server, name)
}

// migratedTemplate returns the name of the migrated template on the
// server at serverURL, creating and migrating it on first use.
func migratedTemplate(serverURL string) (string, error) {
	templates.mu.Lock()
	if templates.byURL == nil {
		templates.byURL = map[string]*template{}
	}
	t := templates.byURL[serverURL]
	if t == nil {
		t = &template{}
		templates.byURL[serverURL] = t
	}
	templates.mu.Unlock()
	t.once.Do(func() { t.err = makeTemplate(serverURL, &t.name) })
	return t.name, t.err
}

// makeTemplate creates a database on the server at serverURL, sets
// *created to its name, migrates it with postgres.Open and closes every
// connection to it, since CREATE DATABASE refuses to copy a database that
// others are connected to.
func makeTemplate(serverURL string, created *string) error {
	name := dbName()
	dbURL, err := withDatabase(serverURL, name)
	if err != nil {
		return err
	}
	if err := createDB(serverURL, name, "template0"); err != nil {
		return fmt.Errorf("pgtest: create template %s: %w", name, err)
	}
	*created = name
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, dbURL, postgres.Options{MaxConns: 1, ApplicationName: "pgtest-template"})
	if err != nil {
		return fmt.Errorf("pgtest: migrate template %s: %w", name, err)
	}
	db.Close()
	// No session may open on it again (a copy needs none, and CREATE
	// DATABASE refuses a template with sessions, after waiting 5 s); the
	// sessions Open used may still be exiting: wait until they are gone.
	if err := execOn(serverURL, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("pgtest: close template %s: %w", name, err)
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("pgtest: close template %s: %w", name, err)
	}
	defer conn.Close(context.Background())
	for {
		var sessions int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name).Scan(&sessions); err != nil {
			return fmt.Errorf("pgtest: close template %s: %w", name, err)
		}
		if sessions == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: close template %s: %d sessions still open: %w", name, sessions, ctx.Err())
		case <-time.After(templateClosePoll):
		}
	}
}

// dropTemplates drops the templates this binary made on DATABASE_URL's
// server (a throwaway cluster goes with them).
func dropTemplates() {
	templates.mu.Lock()
	defer templates.mu.Unlock()
	for serverURL, t := range templates.byURL {
		if t.name == "" || (shared.cluster != nil && serverURL == shared.cluster.URL()) {
			continue
		}
		drop := "DROP DATABASE IF EXISTS " + pgx.Identifier{t.name}.Sanitize() + " WITH (FORCE)"
		if err := execOn(serverURL, drop); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: drop template %s: %v\n", t.name, err)
		}
	}
}

// serverURL returns DATABASE_URL if set and its server has room (see
// hasRoom), else the shared cluster's URL, starting the cluster on first
// use. Without a cluster (no local binaries), a server short of room is
// used anyway: the tests may still fit.
func serverURL() (string, error) {
	u := os.Getenv(envURL)
	if u == "" {
		return clusterURL()
	}
	checked.mu.Lock()
	defer checked.mu.Unlock()
	room, ok := checked.room[u]
	if !ok {
		var why string
		var err error
		room, why, err = hasRoom(u, serverConnsMin)
		if err != nil {
			return "", err
		}
		if !room {
			fmt.Fprintf(os.Stderr, "pgtest: %s: using a throwaway cluster instead\n", why)
		}
		if checked.room == nil {
			checked.room = map[string]bool{}
		}
		checked.room[u] = room
	}
	if room {
		return u, nil
	}
	c, err := clusterURL()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: no throwaway cluster (%v): using %s, short of connections, anyway\n", err, envURL)
		return u, nil
	}
	return c, nil
}

// clusterURL returns the shared cluster's URL, starting it on first use.
func clusterURL() (string, error) {
	shared.once.Do(func() {
		shared.cluster, shared.err = pgcluster.Start(context.Background(), "")
	})
	if shared.err != nil {
		return "", shared.err
	}
	return shared.cluster.URL(), nil
}

// hasRoom reports whether the server at serverURL has at least min free
// connections, and if not, why, in a phrase. Free means what a role
// without superuser's reserve can still open: max_connections, less
// superuser_reserved_connections, less the client backends other than
// this check's own (as scripts/bench/run.sh counts). A server that refuses
// the check for too many clients has none free; one that cannot be
// reached at all is an error, as it was before this check.
func hasRoom(serverURL string, min int) (bool, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	where := envURL + " (" + hostOf(serverURL) + ")"
	conn, err := pgx.Connect(ctx, serverURL)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == tooManyConnections {
		return false, fmt.Sprintf("%s refuses connections: %s", where, pgErr.Message), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("pgtest: %s: %w", where, err)
	}
	defer conn.Close(ctx)
	var free int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())::int`).Scan(&free)
	if err != nil {
		return false, "", fmt.Errorf("pgtest: %s: count free connections: %w", where, err)
	}
	if free < min {
		return false, fmt.Sprintf("%s has %d free connections, fewer than the %d a test binary may use", where, free, min), nil
	}
	return true, "", nil
}

// hostOf returns the host and port of a URL, never its password.
func hostOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "an unparsable URL"
	}
	return u.Host
}

// newDB creates a database on the server at serverURL as a copy of
// template, schedules its drop and returns its URL.
func newDB(tb testing.TB, serverURL, template string) string {
	tb.Helper()
	name := dbName()
	dbURL, err := withDatabase(serverURL, name)
	if err != nil {
		tb.Fatal(err)
	}
	if err := createDB(serverURL, name, template); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		drop := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
		if err := execOn(serverURL, drop); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return dbURL
}

// createDB creates the database name on the server at serverURL as a copy
// of template. template0 is always pristine (template1 may carry
// extensions), and C with UTF8 matches the throwaway cluster, so tests
// behave the same against either; a migrated template was made so too.
func createDB(serverURL, name, template string) error {
	return execOn(serverURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" TEMPLATE "+pgx.Identifier{template}.Sanitize()+" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'")
}

// dbName returns a name unique across concurrent test binaries and runs:
// the pid separates live processes, the counter calls within one, and the
// random suffix a reused pid or a leftover from a killed run.
func dbName() string {
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s_%d_%d_%s", dbNamePrefix, os.Getpid(), dbCounter.Add(1), hex.EncodeToString(b[:]))
}

// withDatabase returns serverURL with its database replaced by name.
func withDatabase(serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("pgtest: %s must be a postgres:// URL, got %q", envURL, serverURL)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// execOn runs one statement on its own connection to serverURL, within
// queryTimeout. CREATE and DROP DATABASE cannot run in a transaction, and
// a fresh connection keeps no state between tests.
func execOn(serverURL, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// NewPrivateDBs starts a throwaway cluster of the test's own (stopped in
// tb.Cleanup) and creates n empty databases on it, for a test that needs
// the cluster to itself: the change stream (internal/ledger.Stream) waits
// for the oldest transaction running in the whole cluster, and other test
// binaries' on a shared server hold some open for seconds.
func NewPrivateDBs(tb testing.TB, n int) []string {
	tb.Helper()
	c, err := pgcluster.Start(context.Background(), "")
	if err != nil {
		tb.Fatalf("pgtest: private cluster: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("pgtest: stop private cluster: %v", err)
		}
	})
	urls := make([]string, n)
	for i := range urls {
		urls[i] = newDB(tb, c.URL(), "template0")
	}
	return urls
}

// BackendsCPU returns the CPU (user and system) used so far by the backends
// of conn's database but conn's own (proccpu, from /proc), for benchmarks
// that report the database's share: the server must run on this machine.
// A backend that has gone counts no more.
func BackendsCPU(tb testing.TB, conn *pgx.Conn) time.Duration {
	tb.Helper()
	rows, err := conn.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		tb.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		tb.Fatal(err)
	}
	cpu, err := proccpu.Tree(pids...)
	if err != nil {
		tb.Fatal(err)
	}
	return cpu
}
