package postgres_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
)

// keyScopeVersion is the migration that keys operations by (sku,
// idempotency_key).
const keyScopeVersion = 8

// TestMigrate_KeyScope: on a database that already holds operations, the
// migration keeps every one as it was and keys them by (sku,
// idempotency_key): the same key may then be recorded on another SKU, and
// not twice on one.
func TestMigrate_KeyScope(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	cfg, conn := migratedBefore(t, keyScopeVersion)
	const populate = `INSERT INTO operations (idempotency_key, sku, kind, params_hash, quantity, shard)
		VALUES ('k-1', 'sku-a', 'deduct', '\x01', 1, 0), ('k-2', 'sku-a', 'reserve', '\x02', 2, 1), ('k-3', 'sku-b', 'deduct', '\x03', 3, 0)`
	if _, err := conn.Exec(ctx, populate); err != nil {
		t.Fatalf("populate = %v", err)
	}
	rows := func() []string {
		t.Helper()
		r, err := conn.Query(ctx, `SELECT sku || '/' || idempotency_key || '/' || kind || '/' || quantity || '/' || shard FROM operations ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := rows()

	if err := postgres.Migrate(ctx, cfg); err != nil {
		t.Fatalf("migrate = %v", err)
	}
	if got := rows(); !slices.Equal(got, want) {
		t.Errorf("operations after the migration = %v, want %v", got, want)
	}
	var key []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(a.attname ORDER BY k.n) FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = 'operations'::regclass AND i.indisprimary`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(key, []string{"sku", "idempotency_key"}) {
		t.Errorf("operations' primary key = %v, want [sku idempotency_key]", key)
	}
	// The primary key's prefix serves lookups by SKU: no second index for
	// every insert to maintain.
	var bySKU bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('operations_sku') IS NOT NULL`).Scan(&bySKU); err != nil || bySKU {
		t.Errorf("index operations_sku present = %v, %v; want dropped", bySKU, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO operations (idempotency_key, sku, kind, params_hash, quantity, shard)
		VALUES ('k-1', 'sku-b', 'deduct', '\x04', 4, 0)`); err != nil {
		t.Errorf("insert k-1 on sku-b (k-1 is sku-a's) = %v, want nil", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO operations (idempotency_key, sku, kind, params_hash, quantity, shard)
		VALUES ('k-1', 'sku-a', 'deduct', '\x01', 1, 0)`); err == nil {
		t.Errorf("insert k-1 on sku-a again = nil, want a unique violation")
	}
}

// migratedBefore returns a new database migrated up to the version before
// version, as a database in service is, and a connection to it.
func migratedBefore(t *testing.T, version int64) (pgx.ConnConfig, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, postgres.Migrations)
	if err != nil {
		t.Fatal(err)
	}
	var before int64
	for _, s := range provider.ListSources() {
		if s.Version < version {
			before = max(before, s.Version)
		}
	}
	if _, err := provider.UpTo(ctx, before); err != nil {
		t.Fatalf("UpTo(%d) = %v", before, err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return *cfg, conn
}

// checkpointsVersion is the migration that adds ledger checkpoints.
const checkpointsVersion = 10

// TestMigrate_Checkpoints: on a database that already holds a ledger, the
// migration gives every shard with entries a checkpoint after its last
// one, with what the entries before it sum to; a shard without entries
// gets none.
func TestMigrate_Checkpoints(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	cfg, conn := migratedBefore(t, checkpointsVersion)
	const populate = `INSERT INTO skus (sku, shards, shard_span, reservation_ttl_ms) VALUES ('sku-a', 2, 2, 1000);
		INSERT INTO shards (sku, idx, partition, available, reserved, sold, opening_available)
			VALUES ('sku-a', 0, 0, 14, 0, 2, 10), ('sku-a', 1, 1, 10, 0, 0, 10);
		INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after, reserved_before, reserved_after,
			sold_before, sold_after, source, server_id, epoch)
			VALUES ('sku-a', 0, 'replenish', 6, 10, 16, 0, 0, 0, 0, 't', 't', 1),
				('sku-a', 0, 'deduct', 2, 16, 14, 0, 0, 0, 2, 't', 't', 1)`
	if _, err := conn.Exec(ctx, populate); err != nil {
		t.Fatalf("populate = %v", err)
	}
	if err := postgres.Migrate(ctx, cfg); err != nil {
		t.Fatalf("migrate = %v", err)
	}
	r, err := conn.Query(ctx, `SELECT shard || ': ' || available || '/' || reserved || '/' || sold || ' received ' || received
		|| ' at the last: ' || (entry_id = (SELECT max(id) FROM ledger))::text FROM ledger_checkpoints ORDER BY shard`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(r, pgx.RowTo[string])
	if want := []string{"0: 14/0/2 received 16 at the last: true"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("checkpoints after the migration = %v, %v; want %v", got, err, want)
	}
}

// skuVersionVersion is the migration that adds skus.version.
const skuVersionVersion = 23

// TestMigrate_SKUVersion: SKUs from before the migration get a version of
// their own, none 0 (a SKU not read from storage): a writer's read of one
// is then checked by version like any other's.
func TestMigrate_SKUVersion(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	cfg, conn := migratedBefore(t, skuVersionVersion)
	// Past two of 00024's batches of 10,000, the third of one row: every
	// boundary between batches is crossed.
	const old = 20_001
	if _, err := conn.Exec(ctx, `INSERT INTO skus (sku, shards, shard_span, reservation_ttl_ms)
		SELECT 'old-' || i, 1, 1, 1000 FROM generate_series(1, $1::int) i`, old); err != nil {
		t.Fatalf("populate = %v", err)
	}
	if err := postgres.Migrate(ctx, cfg); err != nil {
		t.Fatalf("migrate = %v", err)
	}
	var zero, distinct int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE version = 0), count(DISTINCT version) FROM skus`).Scan(&zero, &distinct); err != nil {
		t.Fatal(err)
	}
	if zero != 0 || distinct != old {
		t.Errorf("after the migration: %d SKUs of version 0, %d distinct versions of %d; want none and %d", zero, distinct, old, old)
	}
}
