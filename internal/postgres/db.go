// Package postgres is shardstock's Postgres adapter: the schema and its
// embedded, versioned migrations, and every query. No SQL lives elsewhere.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Deadlines for queries outside the write path.
const (
	migrateTimeout = 60 * time.Second
	queryTimeout   = 10 * time.Second
	// idleInTransactionTimeout ends a transaction whose client stopped
	// answering (see Open).
	idleInTransactionTimeout = "3s"
)

// DB is a pool of connections to one shardstock database.
type DB struct {
	pool *pgxpool.Pool
	// lost counts the lost commits whose outcome was asked, by answer.
	lost struct{ committed, voided, unknown atomic.Int64 }
	spec speculation
	// lockTxs bounds this pool's transactions that take a SKU's admission
	// lock (beginLocked) to half its connections. The lock's holder of an
	// entry batch reads the stock on a second connection; were every
	// connection held by transactions waiting for that same lock, the
	// holder would wait for a connection until its deadline (a stall of
	// every ticket of the SKU). With at most half the pool in such
	// transactions, each holder can always get its second connection.
	lockTxs chan struct{}
}

// Options tune Open.
type Options struct {
	// MaxConns bounds the pool; 0 keeps pgxpool's default.
	MaxConns int32
	// ApplicationName is shown in pg_stat_activity.
	ApplicationName string
	// MigrateURL, when set, is the URL of the schema's owner: the
	// migrations run as that role, which then grants the service's role
	// (url's) what it needs and no more: on the ledger only SELECT and
	// INSERT, so that the service itself can never rewrite the books
	// (grantServiceRole). Empty: url's role migrates and owns the schema.
	MigrateURL string
}

// Open connects to url, applies every pending migration and returns the DB.
func Open(ctx context.Context, url string, opt Options) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse url: %w", err)
	}
	if opt.MaxConns > 0 {
		cfg.MaxConns = opt.MaxConns
	}
	if opt.ApplicationName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = opt.ApplicationName
	}
	// Every query here is a probe by key or a range of one SKU, which an
	// index serves. A flash sale starts on young tables whose statistics
	// are stale, and the planner then prefers sequential scans that grow
	// with the table (measured: 20 ms for a 64-key lookup over 38,000
	// operations, against microseconds by index); cached generic plans keep
	// that choice until an ANALYZE. Make sequential scans the last resort.
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	// Short transactions gain nothing from JIT, and the inflated cost of a
	// sequential scan that remains (a tiny table) would trigger it: 160 ms
	// to compile a one-row aggregate.
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	// Prepared statements would be planned again at every execution (custom
	// plans), 0.1 to 0.45 ms each, over a millisecond per batch. The plans
	// do not depend on the values: an index probe per key either way.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	// A shard server paused mid-batch (SIGSTOP, a long GC, a partition
	// from the database) holds its partition row FOR SHARE, and the new
	// owner's takeover would wait for it forever. Our transactions are never
	// idle between their round trips for more than moments: end any that is.
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = idleInTransactionTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	db := &DB{pool: pool, lockTxs: make(chan struct{}, max(1, pool.Config().MaxConns/2))}
	if opt.MigrateURL == "" {
		err = migrate(ctx, *pool.Config().ConnConfig)
	} else {
		err = migrateAsOwner(ctx, opt.MigrateURL, cfg.ConnConfig.User)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return db, nil
}

// migrateAsOwner migrates as the role of ownerURL and grants role (the
// service's) its privileges.
func migrateAsOwner(ctx context.Context, ownerURL, role string) error {
	owner, err := pgx.ParseConfig(ownerURL)
	if err != nil {
		return fmt.Errorf("postgres: parse migrate url: %w", err)
	}
	if err := migrate(ctx, *owner); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, owner)
	if err != nil {
		return fmt.Errorf("postgres: grant: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return grantServiceRole(ctx, conn, role)
}

// grantServiceRole gives role what the service needs: every table's rows
// (the ledger's and its checkpoints': read and append only, so that not even the service can
// change or remove an entry; the trigger that refuses UPDATE, DELETE and
// TRUNCATE stays for every role), the sequences, and nothing of the schema.
func grantServiceRole(ctx context.Context, conn *pgx.Conn, role string) error {
	r := pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		`GRANT USAGE ON SCHEMA public TO ` + r,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + r,
		`REVOKE UPDATE, DELETE, TRUNCATE ON ledger, ledger_checkpoints FROM ` + r,
		`GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO ` + r,
		`REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON goose_db_version FROM ` + r,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("postgres: grant %s: %w", role, err)
		}
	}
	return nil
}

// Close closes every connection.
func (db *DB) Close() { db.pool.Close() }

// PoolStat is the connection pool's state (for /metrics).
func (db *DB) PoolStat() *pgxpool.Stat { return db.pool.Stat() }

// migrate applies the embedded migrations on a connection of its own (not
// the pool's) as cfg's role, under goose's Postgres session lock, so that
// many processes starting at once migrate once, whatever the pool's size.
func migrate(ctx context.Context, cfg pgx.ConnConfig) error {
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	sqlDB := stdlib.OpenDB(cfg)
	defer sqlDB.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, mustSub(migrations, "migrations"), goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	return nil
}

// isNoRows reports whether err is pgx's no-rows error.
func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
