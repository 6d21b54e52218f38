package postgres

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/shardstock/shardstock/internal/pgtest"
)

// keyScopeVersion is the migration that keys operations by (sku,
// idempotency_key).
const keyScopeVersion = 8

// TestMigrate_KeyScope: on a database that already holds operations, the
// migration keeps every one as it was and keys them by (sku,
// idempotency_key): the same key may then be recorded on another SKU, and
// not twice on one.
func TestMigrate_KeyScope(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDB(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	// Migrate up to the version before, as a database in service is.
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, mustSub(migrations, "migrations"))
	if err != nil {
		t.Fatal(err)
	}
	var before int64
	for _, s := range provider.ListSources() {
		if s.Version < keyScopeVersion {
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
	defer conn.Close(ctx)
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

	if err := migrate(ctx, *cfg); err != nil {
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
