package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/ledger"
)

// walked returns how far the walk got on sku's shard 0 and the end of the
// stretch it found unsound (0: none).
func (b *books) walked(t *testing.T, sku string) (to, unsoundTo int64) {
	t.Helper()
	err := b.conn.QueryRow(context.Background(), `SELECT coalesce(max(walked_to), 0), coalesce(max(unsound_to), 0)
		FROM ledger_walks WHERE sku = $1 AND shard = 0`, sku).Scan(&to, &unsoundTo)
	if err != nil {
		t.Fatalf("walked(%s): %v", sku, err)
	}
	return to, unsoundTo
}

// checkpointAt returns the entry id of sku's checkpoint whose available is
// available (fill's entry i leaves available at i).
func (b *books) checkpointAt(t *testing.T, sku string, available int) int64 {
	t.Helper()
	var id int64
	if err := b.conn.QueryRow(context.Background(), `SELECT entry_id FROM ledger_checkpoints WHERE sku = $1 AND available = $2`,
		sku, available).Scan(&id); err != nil {
		t.Fatalf("checkpoint of %s at %d: %v", sku, available, err)
	}
	return id
}

// TestScheduler_WalksStretches: an entry in an old stretch of a ledger
// (between two checkpoints, before the latest) changed outside the
// service, and a wrong checkpoint written between two right ones, are
// invisible to a reconciliation that reads from the latest checkpoint on;
// scheduled passes walk every stretch once, at most a bound per pass, find
// both, show them on shardstock_reconcile_unbalanced, record how far they
// got, and do not walk past what they found.
func TestScheduler_WalksStretches(t *testing.T) {
	t.Parallel() // its own database (and etcd): nothing shared
	const (
		cps    = 5 // checkpoints per SKU, each ending a stretch
		n      = cps*ledger.CheckpointEntries + 10
		budget = 4 // stretches per pass: each SKU's walk takes more than one pass
	)
	b := openBooks(t)
	for _, sku := range []string{"a", "b", "c"} {
		b.fill(t, sku, n)
	}
	// b: entry 2,500 (of the third stretch) moved one more unit than it
	// says, the next entry starting where it claims to end.
	b.exec(t, `ALTER TABLE ledger DISABLE TRIGGER ledger_append_only`)
	b.exec(t, `UPDATE ledger SET available_after = available_after + 1 WHERE sku = 'b' AND available_after = 2500`)
	b.exec(t, `ALTER TABLE ledger ENABLE TRIGGER ledger_append_only`)
	// c: a checkpoint at entry 1,500 that is one unit off.
	b.exec(t, `INSERT INTO ledger_checkpoints (sku, shard, entry_id, available, reserved, sold, received)
		SELECT sku, shard, id, available_after + 1, 0, 0, available_after + 1 FROM ledger WHERE sku = 'c' AND available_after = 1500`)
	for _, sku := range []string{"a", "b", "c"} {
		snap, err := b.db.Snapshot(context.Background(), sku)
		if err != nil {
			t.Fatalf("Snapshot(%s) = %v", sku, err)
		}
		if ds := ledger.Check(snap); len(ds) > 0 {
			t.Fatalf("Check(Snapshot(%s)) from the latest checkpoint = %+v, want balanced (the fault is in an old stretch)", sku, ds)
		}
	}

	reg := scheduledWalking(t, etcdtest.Start(t), "alloc-a", b.db, 20*time.Millisecond, budget)

	lastA := b.checkpointAt(t, "a", cps*ledger.CheckpointEntries)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if got := value(t, reg, "shardstock_reconcile_pass_stretches", ""); got > budget {
			t.Fatalf("shardstock_reconcile_pass_stretches = %v, want at most %d", got, budget)
		}
		aTo, _ := b.walked(t, "a")
		_, bBad := b.walked(t, "b")
		_, cBad := b.walked(t, "c")
		if aTo == lastA && bBad != 0 && cBad != 0 && value(t, reg, "shardstock_reconcile_unbalanced", "") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: a walked to %d (want %d), b and c found unsound at %d and %d, unbalanced %v; want both found and 2",
				aTo, lastA, bBad, cBad, value(t, reg, "shardstock_reconcile_unbalanced", ""))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Each walk stopped at its fault: b's after its second stretch, c's
	// after its first (its wrong checkpoint ends the second).
	for _, w := range []struct {
		sku              string
		to, unsound, lag int
	}{
		{"b", 2 * ledger.CheckpointEntries, 3 * ledger.CheckpointEntries, 0},
		{"c", ledger.CheckpointEntries, 1500, 1},
	} {
		to, bad := b.walked(t, w.sku)
		if want := b.checkpointAt(t, w.sku, w.to); to != want {
			t.Errorf("%s walked to entry %d, want %d (the checkpoint before the fault)", w.sku, to, want)
		}
		if want := b.checkpointAt(t, w.sku, w.unsound+w.lag); bad != want {
			t.Errorf("%s found unsound the stretch to entry %d, want %d", w.sku, bad, want)
		}
	}
	// From then on a plain reconciliation reports it too.
	snap, err := b.db.Snapshot(context.Background(), "b")
	if err != nil {
		t.Fatalf("Snapshot(b) = %v", err)
	}
	if ds := ledger.Check(snap); len(ds) != 1 || ds[0].Check != ledger.CheckWalk {
		t.Errorf("Check(Snapshot(b)) after the walk = %+v, want one %s", ds, ledger.CheckWalk)
	}
}
