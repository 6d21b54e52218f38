package shard_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// tamper runs sql on the test's database behind the shard server's back, as
// a second writer or a hand in psql would.
func tamper(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// servedShard creates sku with one shard of 100 units, served by server
// "a", whose writer has its copy of the row after one deduct (key k1).
func servedShard(t *testing.T, sku string) (*postgres.DB, string, *shard.Server) {
	t.Helper()
	db, url := openDB(t)
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1}, 100)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0)
	if res := s.Do(context.Background(), &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: "k1"}); res.Err != nil {
		t.Fatalf("Deduct(k1) = %v", res.Err)
	}
	return db, url, s
}

// TestShard_DivergenceRecovered: the row changes behind the writer, with a
// ledger entry that accounts for it (a write whose answer the writer
// misjudged). The writer's next batch finds its copy wrong, reloads the row,
// checks it against the ledger and goes on from it: the batch succeeds and
// nothing is halted.
func TestShard_DivergenceRecovered(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	const sku = "diverge-ok"
	db, url, s := servedShard(t, sku)
	sh := stock.ShardKey{SKU: sku}
	ctx := context.Background()
	tamper(t, url, `WITH o AS (INSERT INTO operations (sku, idempotency_key, kind, params_hash, quantity, shard)
			VALUES ($1, 'elsewhere', 'deduct', '\x00', 5, 0)),
		l AS (INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after, reserved_before,
			reserved_after, sold_before, sold_after, idempotency_key, source, server_id, epoch)
			VALUES ($1, 0, 'deduct', 5, 99, 94, 0, 0, 1, 6, 'elsewhere', 'api', 'other', 1))
		UPDATE shards SET available = 94, sold = 6 WHERE sku = $1 AND idx = 0`, sku)

	res := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "k2"})
	if res.Err != nil {
		t.Fatalf("Deduct(k2) after the row changed = %v, want a success (recovered)", res.Err)
	}
	if res.Available != 93 {
		t.Errorf("Deduct(k2).Available = %d, want 93 (the row's 94, less 1)", res.Available)
	}
	if h := s.Halted(); len(h) != 0 {
		t.Errorf("Halted() = %v, want none", h)
	}
	reconcile(t, db, sku)
}

// TestShard_HaltedUntilResumed: the row changes behind the writer with no
// ledger entry. The writer halts the shard with a reason, on its row: the
// server refuses it, GetStock's rows show why, a new owner of the partition
// refuses it too, and once an operator resumes it the shard serves again.
func TestShard_HaltedUntilResumed(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	const sku = "diverge-halt"
	db, url, a := servedShard(t, sku)
	sh := stock.ShardKey{SKU: sku}
	ctx := context.Background()
	tamper(t, url, `UPDATE shards SET available = available - 5 WHERE sku = $1 AND idx = 0`, sku)

	res := a.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "k2"})
	if res.Err == nil || res.Err.Code != stock.CodeShardUnavailable || !strings.Contains(res.Err.Message, "halted") {
		t.Fatalf("Deduct(k2) after an unledgered change = %+v, want SHARD_UNAVAILABLE (halted)", res)
	}
	if reason := a.Halted()[sh]; !strings.Contains(reason, "ledger") {
		t.Errorf("Halted()[%s] = %q, want a reason naming the ledger", sh, reason)
	}
	rows, err := db.Shards(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if rows[0].HaltReason == "" {
		t.Errorf("Shards(%s)[0].HaltReason is empty, want the halt recorded on the row", sku)
	}
	if ops, _ := db.LookupOperations(ctx, sku, []string{"k2"}); len(ops) != 0 {
		t.Errorf("a refused request on a halted shard wrote operation %v", ops)
	}

	// A new owner reads the halt from the row.
	b := newServer(t, db, "b")
	acquire(t, b, sku, 2, 0)
	if res := b.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "k3"}); res.Err == nil || !strings.Contains(res.Err.Message, "halted") {
		t.Fatalf("Deduct(k3) on the new owner = %+v, want halted", res)
	}

	// An operator resumes it: the row is taken as it is.
	was, err := db.ResumeShard(ctx, sh)
	if err != nil || was == "" {
		t.Fatalf("ResumeShard = %q, %v; want the reason it had", was, err)
	}
	if _, err := db.ResumeShard(ctx, sh); stock.CodeOf(err) != stock.CodeShardNotHalted {
		t.Errorf("ResumeShard again = %v, want SHARD_NOT_HALTED", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := b.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "k4"})
		if res.Err == nil {
			if res.Available != 93 {
				t.Errorf("Deduct(k4).Available = %d, want 93 (the row as resumed, 94, less 1)", res.Available)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Deduct(k4) after ResumeShard = %v for 10s, want a success", res.Err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if h := b.Halted(); len(h) != 0 {
		t.Errorf("Halted() after resume = %v, want none", h)
	}
}

// TestShard_SeededWriterClearsHaltedGauge: a shard halted here is resumed by
// an operator and its partition taken again (which forgets the halt here);
// its next writer starts from a sibling's seed, and its first commit
// clears shardstock_shard_halted, as a writer that read its row does.
func TestShard_SeededWriterClearsHaltedGauge(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	const sku = "halt-gauge"
	db, url, s, reg := meteredServer(t, sku, 2, 100)
	ctx := context.Background()
	sh0, sh1 := stock.ShardKey{SKU: sku}, stock.ShardKey{SKU: sku, Index: 1}
	deduct := func(sh stock.ShardKey, key string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: key})
	}
	if res := deduct(sh1, "k1"); res.Err != nil {
		t.Fatalf("Deduct(k1) = %v", res.Err)
	}
	tamper(t, url, `UPDATE shards SET available = available - 5 WHERE sku = $1 AND idx = 1`, sku)
	if res := deduct(sh1, "k2"); res.Err == nil || !strings.Contains(res.Err.Message, "halted") {
		t.Fatalf("Deduct(k2) after an unledgered change = %+v, want halted", res)
	}
	if g := haltedGauge(t, reg, sh1); g != 1 {
		t.Fatalf("shardstock_shard_halted{shard=1} = %v after the halt, want 1", g)
	}
	if _, err := db.ResumeShard(ctx, sh1); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, sku, 2, 0, 1)
	// Shard 0's first batch reads shard 1's row as a seed.
	if res := deduct(sh0, "k3"); res.Err != nil {
		t.Fatalf("Deduct(k3) = %v", res.Err)
	}
	before := speculativeGroups(t, reg, "committed")
	if res := deduct(sh1, "k4"); res.Err != nil {
		t.Fatalf("Deduct(k4) after the resume = %v", res.Err)
	}
	if c := speculativeGroups(t, reg, "committed"); c != before+1 {
		t.Fatalf("speculative groups committed %v -> %v: shard 1's writer did not start from a seed", before, c)
	}
	if g := haltedGauge(t, reg, sh1); g != 0 {
		t.Errorf("shardstock_shard_halted{shard=1} = %v after the resumed shard served, want none", g)
	}
}

// haltedGauge is shardstock_shard_halted of sh in reg, 0 if absent.
func haltedGauge(t *testing.T, reg *prometheus.Registry, sh stock.ShardKey) float64 {
	t.Helper()
	return series(reg, "shardstock_shard_halted", map[string]string{"sku": sh.SKU, "shard": strconv.Itoa(int(sh.Index))}).GetGauge().GetValue()
}
