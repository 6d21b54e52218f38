package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// standbyName is the synchronous standby's application_name.
const standbyName = "sync1"

// syncPair starts a primary with one synchronous standby, each a throwaway
// cluster of the test's own, and returns them and the primary's URL.
func syncPair(t *testing.T) (primary, standby *pgcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	primary, standby, err := pgcluster.StartSyncPair(ctx, standbyName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop(); primary.Stop() })
	return primary, standby
}

// TestDurability_Settings holds each synchronous_commit setting to what
// docs/architecture.md says it acknowledges, with a synchronous standby
// named and the standby stopped: on, remote_write and remote_apply do not
// return a commit the standby has not got (the commit waits), local does;
// and Durability.Check refuses local, and off, when a synchronous standby
// is required.
func TestDurability_Settings(t *testing.T) {
	primary, standby := syncPair(t)
	ctx := context.Background()
	conn := connect(t, primary.URL())
	exec(t, conn, `CREATE TABLE acks (setting text)`)
	if err := standby.Crash(); err != nil {
		t.Fatal(err)
	}
	const waitFor = 500 * time.Millisecond
	for _, tc := range []struct {
		setting  string
		returned bool // whether the commit returns with the standby gone
	}{
		{"on", false},
		{"remote_write", false},
		{"remote_apply", false},
		{"local", true},
		{"off", true},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			c := connect(t, primary.URL())
			exec(t, c, `SET synchronous_commit = `+tc.setting)
			cctx, cancel := context.WithTimeout(ctx, waitFor)
			defer cancel()
			_, err := c.Exec(cctx, `INSERT INTO acks VALUES ($1)`, tc.setting)
			if returned := err == nil; returned != tc.returned {
				t.Errorf("INSERT with synchronous_commit=%s and the standby stopped: returned within %s = %v (err %v), want %v",
					tc.setting, waitFor, returned, err, tc.returned)
			}
			d := postgres.Durability{SynchronousCommit: tc.setting, Fsync: true, SynchronousStandbyNames: standbyName, Standbys: 1}
			if problems, _ := d.Check(true); (len(problems) == 0) == tc.returned {
				t.Errorf("Durability%+v.Check(true) = problems %q, want some iff a commit returns without the standby", d, problems)
			}
		})
	}
}

// TestDB_SyncStandbyLost: with a synchronous standby named and the
// standby lost, a group's COMMIT waits for it past the group's deadline.
// The group must not be acknowledged, nor seen by anyone, before the
// standby has it: not when pgx gives the COMMIT up at the deadline (its
// close sends a cancel request, and a cancelled wait for the standby shows
// the commit to everyone), nor when the void that asks for its outcome
// ends the backends that block it. Once the standby is back the group is
// learnt as committed.
func TestDB_SyncStandbyLost(t *testing.T) {
	primary, standby := syncPair(t)
	ctx := context.Background()
	db, err := postgres.Open(ctx, primary.URL(), postgres.Options{ApplicationName: "postgrestest"})
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	t.Cleanup(db.Close)
	k := stock.ShardKey{SKU: "sync-sku"}
	createSKU(t, db, stock.SKU{Name: k.SKU, Shards: 1}, 10)
	f := stock.Fence{Partition: k.Partition(), Epoch: 1, ServerID: "srv"}
	if err := db.TakeOver(ctx, f.Partition, f.ServerID, f.Epoch); err != nil {
		t.Fatalf("TakeOver = %v", err)
	}
	reader := connect(t, primary.URL())
	visible := func() (bool, error) {
		var n int64
		err := reader.QueryRow(ctx, `SELECT count(*) FROM operations WHERE idempotency_key = 'k1'`).Scan(&n)
		return n > 0, err
	}

	if err := standby.Crash(); err != nil {
		t.Fatal(err)
	}
	// The group's deadline passes with its COMMIT waiting; the void then
	// waits, ending blockers every 200 ms, until the standby is back.
	const deadline, lostFor = time.Second, 4 * time.Second
	type outage struct {
		seen    bool // the operation visible with the standby lost
		seenErr error
		back    time.Time // when the standby was started again
	}
	ended := make(chan outage, 1)
	go func() {
		time.Sleep(lostFor)
		var o outage
		o.seen, o.seenErr = visible()
		o.back = time.Now()
		if err := standby.Restart(ctx); err != nil {
			t.Errorf("restart the standby: %v", err)
		}
		ended <- o
	}()
	bctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	var d decision
	err = db.Batch(bctx, f, stock.BatchQuery{Shard: k, Keys: []string{"k1"}}, deductOne(k, "k1", stock.Counts{Available: 10}, false, &d))
	answered := time.Now()
	o := <-ended
	t.Logf("Batch(deduct k1) = %v, %s after the standby was back; lost commits %+v", err, answered.Sub(o.back), db.LostCommits())
	if o.seenErr != nil || o.seen {
		t.Errorf("the group's operation visible %s after its deadline, with the standby lost = %v (%v), want false", lostFor-deadline, o.seen, o.seenErr)
	}
	if answered.Before(o.back) {
		t.Errorf("Batch(deduct k1) = %v, answered %s before the standby was back, want it held until then", err, o.back.Sub(answered))
	}
	switch {
	case err == nil:
		if v, err := visible(); !v || err != nil {
			t.Errorf("Batch(deduct k1) = nil, but its operation is visible = %v (%v)", v, err)
		}
	case errors.Is(err, stock.ErrOutcomeUnknown):
	default:
		t.Errorf("Batch(deduct k1) = %v, want nil (learnt committed) or stock.ErrOutcomeUnknown", err)
	}
}
