package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestShard_Transfer: a two-phase transfer moves stock once, counts as in
// transit between its steps, is idempotent per step, aborts when the source
// lacks stock, and is finished by the sweep when its mover dies half-way.
func TestShard_Transfer(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, _ := openDB(t)
	const sku = "move-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 2}, 20) // 10 and 10
	stale := func(s *shard.Server) { shard.SetTransferStaleAge(s, 200*time.Millisecond) }
	a := newServer(t, db, "a", stale)
	b := newServer(t, db, "b", stale)
	acquire(t, a, sku, 1, 0)
	acquire(t, b, sku, 1, 1)
	ctx := context.Background()
	step := func(s *shard.Server, kind stock.OpKind, idx int32, id string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: kind, Shard: stock.ShardKey{SKU: sku, Index: idx}, TransferID: id, Source: "rebalancer"})
	}
	newTransfer := func(q int64) string {
		t.Helper()
		tr := &stock.Transfer{ID: stock.NewTransferID(), SKU: sku, From: 0, To: 1, Quantity: q, Reason: "test"}
		if err := db.CreateTransfer(ctx, tr); err != nil {
			t.Fatal(err)
		}
		return tr.ID
	}

	t.Run("OK", func(t *testing.T) {
		id := newTransfer(4)
		if res := step(a, stock.OpTransferIn, 0, id); res.Err == nil {
			t.Errorf("transfer_in on the source = %+v, want an error", res)
		}
		if res := step(b, stock.OpTransferIn, 1, id); res.Err == nil || res.Err.Code != stock.CodeShardUnavailable {
			t.Errorf("transfer_in before the debit = %+v, want SHARD_UNAVAILABLE", res)
		}
		if res := step(a, stock.OpTransferOut, 0, id); res.Err != nil || res.Transfer.State != stock.TransferDebited {
			t.Fatalf("transfer_out = %+v, want debited", res)
		}
		if res := step(a, stock.OpTransferOut, 0, id); res.Err != nil || !res.Replayed {
			t.Errorf("transfer_out again = %+v, want a replay", res)
		}
		if n, _ := db.InTransit(ctx, sku); n != 4 {
			t.Errorf("in transit = %d, want 4", n)
		}
		reconcile(t, db, sku) // balanced with stock in transit
		if res := step(b, stock.OpTransferIn, 1, id); res.Err != nil || res.Transfer.State != stock.TransferCredited {
			t.Fatalf("transfer_in = %+v, want credited", res)
		}
		if res := step(b, stock.OpTransferIn, 1, id); res.Err != nil || !res.Replayed {
			t.Errorf("transfer_in again = %+v, want a replay", res)
		}
		rows, _ := db.Shards(ctx, sku)
		if rows[0].Available != 6 || rows[1].Available != 14 {
			t.Errorf("shards = %+v, want 6 and 14", rows)
		}
		reconcile(t, db, sku)
	})
	t.Run("NotEnough", func(t *testing.T) {
		id := newTransfer(100)
		if res := step(a, stock.OpTransferOut, 0, id); res.Err == nil || res.Err.Code != stock.CodeOutOfStock {
			t.Errorf("transfer_out of more than available = %+v, want OUT_OF_STOCK", res)
		}
		if tr, _ := db.GetTransfer(ctx, id); tr.State != stock.TransferAborted {
			t.Errorf("transfer state = %s, want aborted", tr.State)
		}
		reconcile(t, db, sku)
	})
	t.Run("FinishedBySweep", func(t *testing.T) {
		pending, debited := newTransfer(1), newTransfer(2)
		if res := step(a, stock.OpTransferOut, 0, debited); res.Err != nil {
			t.Fatal(res.Err)
		}
		// The mover "dies" here: nobody steps either transfer again.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			p, _ := db.GetTransfer(ctx, pending)
			d, _ := db.GetTransfer(ctx, debited)
			if p.State == stock.TransferCredited && d.State == stock.TransferCredited {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, id := range []string{pending, debited} {
			if tr, _ := db.GetTransfer(ctx, id); tr.State != stock.TransferCredited {
				t.Errorf("transfer %s = %s, want credited by the sweep", id, tr.State)
			}
		}
		rows, _ := db.Shards(ctx, sku)
		if rows[0].Available != 3 || rows[1].Available != 17 {
			t.Errorf("shards = %+v, want 3 and 17", rows)
		}
		reconcile(t, db, sku)
	})
}
