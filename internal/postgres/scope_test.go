package postgres_test

import (
	"context"
	"testing"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestDB_KeyScope: operations are keyed by (sku, idempotency_key). The same
// key on two SKUs of one database is two operations, written by one group
// (speculative or not) without a conflict; every lookup (a group's read,
// GetOperation, a sold-out check's) finds the SKU's own.
func TestDB_KeyScope(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	ten := stock.Counts{Available: 10}
	skus := []string{"scope-x", "scope-y"}
	// setup makes both SKUs, one shard of 10 each, owned by "srv" at epoch 7.
	setup := func(t *testing.T) (*postgres.DB, []stock.ShardKey, []stock.Fence, []*stock.SKU) {
		t.Helper()
		db, _ := mustOpen(t)
		var ks []stock.ShardKey
		var fs []stock.Fence
		var known []*stock.SKU
		for _, name := range skus {
			createSKU(t, db, stock.SKU{Name: name, Shards: 1}, 10)
			k := stock.ShardKey{SKU: name}
			f := stock.Fence{Partition: k.Partition(), Epoch: 7, ServerID: "srv"}
			if err := db.TakeOver(ctx, f.Partition, f.ServerID, f.Epoch); err != nil {
				t.Fatalf("TakeOver = %v", err)
			}
			s, err := db.GetSKU(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			ks, fs, known = append(ks, k), append(fs, f), append(known, s)
		}
		return db, ks, fs, known
	}
	// group runs one unit per SKU, each a deduct of key from a shard
	// believed at from, and fails unless every unit's read held its own
	// SKU's operation, if any.
	group := func(t *testing.T, db *postgres.DB, ks []stock.ShardKey, fs []stock.Fence, known []*stock.SKU, key string, from stock.Counts) []decision {
		t.Helper()
		ds := make([]decision, len(ks))
		units := make([]*stock.Unit, len(ks))
		for i, k := range ks {
			d := deductOne(k, key, from, false, &ds[i])
			units[i] = &stock.Unit{Fence: fs[i], Query: stock.BatchQuery{Shard: k, Keys: []string{key}, KnownSKU: known[i]},
				Decide: func(read *stock.BatchRead) (*stock.BatchWrite, error) {
					if op := read.Ops[key]; op != nil && op.SKU != k.SKU {
						t.Errorf("%s's read of %s = an operation of %s, want its own", k.SKU, key, op.SKU)
					}
					return d(read)
				}}
		}
		if err := db.Group(ctx, units); err != nil {
			t.Fatalf("Group(%s on %v) = %v, want nil", key, skus, err)
		}
		for i, u := range units {
			if u.Err != nil {
				t.Fatalf("Group(%s on %v) unit %d = %v, want nil", key, skus, i, u.Err)
			}
		}
		return ds
	}
	nine := ten.Add(stock.OpDeduct.Delta(1))

	for _, tc := range []struct {
		name  string
		known bool // writers know their SKU: the group is written in one round trip
	}{{"Read", false}, {"Speculative", true}} {
		t.Run(tc.name, func(t *testing.T) {
			db, ks, fs, known := setup(t)
			if !tc.known {
				known = make([]*stock.SKU, len(ks))
			}
			ds := group(t, db, ks, fs, known, "k", ten)
			for i, d := range ds {
				if d.replayed {
					t.Errorf("Group(k) on %s: replayed, want a new operation", ks[i].SKU)
				}
			}
			// Both retried in one group, read first: each a replay of its own.
			for i, d := range group(t, db, ks, fs, make([]*stock.SKU, len(ks)), "k", nine) {
				if !d.replayed {
					t.Errorf("Group(k) again on %s: not replayed, want its operation", ks[i].SKU)
				}
			}
			for _, k := range ks {
				if c, err := db.LoadShard(ctx, k); err != nil || c != nine {
					t.Errorf("LoadShard(%s) = %+v, %v, want %+v (one deduct)", k, c, err, nine)
				}
			}
		})
	}

	t.Run("Lookups", func(t *testing.T) {
		db, ks, fs, known := setup(t)
		// k recorded on scope-x only: scope-y has no operation of k.
		group(t, db, ks[:1], fs[:1], known[:1], "k", ten)
		if _, _, ops, err := db.SoldOutCheck(ctx, "scope-y", []string{"k"}); err != nil || len(ops) != 0 {
			t.Errorf("Sweep(scope-y, [k]) = %+v, %v, want no operation (k is scope-x's)", ops, err)
		}
		if _, err := db.GetOperation(ctx, "scope-y", "k"); stock.CodeOf(err) != stock.CodeOperationNotFound {
			t.Errorf("GetOperation(scope-y, k) = %v, want OPERATION_NOT_FOUND", err)
		}
		group(t, db, ks[1:], fs[1:], known[1:], "k", ten)
		for _, sku := range skus {
			op, err := db.GetOperation(ctx, sku, "k")
			if err != nil || op.SKU != sku || op.IdempotencyKey != "k" {
				t.Errorf("GetOperation(%s, k) = %+v, %v, want its own operation", sku, op, err)
			}
			_, _, ops, err := db.SoldOutCheck(ctx, sku, []string{"k", "other"})
			if err != nil || len(ops) != 1 || ops["k"] == nil || ops["k"].SKU != sku {
				t.Errorf("Sweep(%s, [k other]) = %+v, %v, want its own operation of k only", sku, ops, err)
			}
		}
	})
}
