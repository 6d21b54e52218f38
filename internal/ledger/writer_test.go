package ledger_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// writing is a shard server owning sku's shard 0 at epoch, until stop.
type writing struct {
	srv  *shard.Server
	k    stock.ShardKey
	n    *int // requests made, for their keys
	stop func()
}

func startWriting(t *testing.T, b *books, id, sku string, epoch int64, n *int) *writing {
	t.Helper()
	srv := shard.New(shard.Config{ServerID: id, DB: b.db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	w := &writing{srv: srv, k: stock.ShardKey{SKU: sku, Index: 0}, n: n, stop: func() { cancel(); <-done }}
	t.Cleanup(w.stop)
	if err := srv.Acquire(context.Background(), w.k.Partition(), epoch); err != nil {
		t.Fatalf("Acquire(%s, %d) = %v", w.k, epoch, err)
	}
	return w
}

// write makes count requests one after another, each its own batch:
// replenishes of 3 and deducts of 1 in turn.
func (w *writing) write(t *testing.T, count int) {
	t.Helper()
	for range count {
		*w.n++
		r := &stock.Request{Kind: stock.OpReplenish, Shard: w.k, Quantity: 3, Key: fmt.Sprintf("r-%d", *w.n)}
		if *w.n%2 == 0 {
			r.Kind, r.Quantity = stock.OpDeduct, 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res := w.srv.Do(ctx, r)
		cancel()
		if res.Err != nil {
			t.Fatalf("Do(%s %d) = %v", r.Kind, r.Quantity, res.Err)
		}
	}
}

// tail returns the number of entries after the shard's latest checkpoint,
// and how many checkpoints it has.
func (b *books) tail(t *testing.T, sku string) (entries, checkpoints int) {
	t.Helper()
	err := b.conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM ledger WHERE sku = $1 AND id > (SELECT coalesce(max(entry_id), 0) FROM ledger_checkpoints WHERE sku = $1)),
		(SELECT count(*) FROM ledger_checkpoints WHERE sku = $1)`, sku).Scan(&entries, &checkpoints)
	if err != nil {
		t.Fatalf("tail(%s): %v", sku, err)
	}
	return entries, checkpoints
}

// TestCheckpoint_Writer: the shard's writer writes a checkpoint every
// ledger.CheckpointEntries entries, and a new writer, not knowing how many
// its predecessor left, writes one as soon as they are enough; each
// checkpoint is what the whole ledger before it sums to.
func TestCheckpoint_Writer(t *testing.T) {
	t.Parallel() // its own database (and etcd): nothing shared
	const n = ledger.CheckpointEntries
	b := openBooks(t)
	sku := "written"
	if err := b.db.CreateSKU(context.Background(), stock.SKU{Name: sku, Shards: 1, Status: stock.StatusActive, ReservationTTL: stock.ReservationTTLDefault}, 100); err != nil {
		t.Fatalf("CreateSKU(%s) = %v", sku, err)
	}
	var made int
	a := startWriting(t, b, "srv-a", sku, 1, &made)
	a.write(t, 2*n)
	entries, cps := b.tail(t, sku)
	if cps == 0 || entries >= n {
		t.Fatalf("after %d entries by one writer: %d checkpoints, %d entries after the last, want some and fewer than %d", 2*n, cps, entries, n)
	}
	a.write(t, n-1-entries) // one short of the next checkpoint
	if entries, _ = b.tail(t, sku); entries != n-1 {
		t.Fatalf("entries after the last checkpoint = %d, want %d", entries, n-1)
	}
	a.stop()
	before := cps
	_, cps = b.tail(t, sku)
	startWriting(t, b, "srv-b", sku, 2, &made).write(t, 1)
	if entries, cps = b.tail(t, sku); entries != 0 || cps != before+1 {
		t.Errorf("after a new writer's first entry: %d checkpoints (was %d), %d entries after the last, want one more and none after", cps, before, entries)
	}

	var wrong int
	err := b.conn.QueryRow(context.Background(), `SELECT count(*) FROM ledger_checkpoints c
		JOIN shards s ON s.sku = c.sku AND s.idx = c.shard
		CROSS JOIN LATERAL (SELECT sum(available_after - available_before) FILTER (WHERE kind IN ('replenish', 'adjust')) AS inflow
			FROM ledger l WHERE l.sku = c.sku AND l.shard = c.shard AND l.id <= c.entry_id) sums
		JOIN ledger e ON e.sku = c.sku AND e.id = c.entry_id
		WHERE c.sku = $1 AND ((c.available, c.reserved, c.sold) IS DISTINCT FROM (e.available_after, e.reserved_after, e.sold_after)
			OR c.received <> s.opening_available + sums.inflow)`, sku).Scan(&wrong)
	if err != nil || wrong != 0 {
		t.Errorf("checkpoints not what the ledger before them sums to: %d, %v; want none", wrong, err)
	}
	snap, err := b.db.Snapshot(context.Background(), sku)
	if err != nil {
		t.Fatalf("Snapshot(%s) = %v", sku, err)
	}
	if ds := ledger.Check(snap); len(ds) > 0 {
		t.Errorf("Check(Snapshot(%s)) = %+v, want balanced", sku, ds)
	}
	t.Logf("%d entries, %d checkpoints", made, cps)
}
