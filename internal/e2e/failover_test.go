package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/pgcluster"
)

// Bounds of the failover run.
const (
	// standbyLostFor is how long the synchronous standby is down before
	// the primary dies: longer than a batch's deadline (10 s), so that the
	// groups committed while it was away have had their COMMIT given up
	// and their outcome asked, and the clients' GetOperation before their
	// next tries (every 3 s) has had time to find what that made visible
	// (on the code before the fix: 1 acknowledged reservation lost at
	// 14 s, 7 at 25 s).
	standbyLostFor = 17 * time.Second
	// failoverResumeMax bounds the time from the standby's promotion to the
	// first sale acknowledged by it: the writers' connections fail, a new
	// connection finds the promoted server (target_session_attrs), the
	// outcome of each group in flight is learnt there (commitOutcome backs
	// off up to 1 s between attempts), and an allocator's open breaker
	// lets a probe through (2 s). Measured: well under a second.
	failoverResumeMax = 10 * time.Second
)

// TestE2E_SyncStandbyFailover runs a sale on a primary with a synchronous
// standby (synchronous_standby_names, synchronous_commit=on, and the shard
// servers started with SHARDSTOCK_REQUIRE_SYNC_STANDBY=1, as in the prod
// overlay) and lets it fail over the hard way: the standby is lost
// (stopped immediately, as a lost host) for longer than a batch's
// deadline, then the primary dies too, and the standby comes back with the
// WAL it had flushed and is promoted. Every process's DATABASE_URL names
// both servers with target_session_attrs=read-write, so the service
// follows the promotion. checkHistory then holds the run against the
// promoted server: every acknowledged deduct, reserve, commit and release
// is in its ledger exactly once, the sold units are the acknowledged ones,
// the history is linearizable, and sales resumed after the promotion,
// within failoverResumeMax.
//
// The promoted server runs without a standby of its own, so its commits
// do not wait for one: what follows a failover (a new standby, which
// CloudNativePG makes) is outside this test.
func TestE2E_SyncStandbyFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	const standbyName = "standby1"
	primary, standby, err := pgcluster.StartSyncPair(ctx, standbyName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop(); primary.Stop() })
	dbURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	s := newStackOpts(t, stackOpts{shardServers: 3, dbURL: dbURL, env: []string{"SHARDSTOCK_REQUIRE_SYNC_STANDBY=1"}})
	const sku = "failover"
	s.createSKU(sku, linStock, 8)

	// When the standby was lost, the primary crashed and the standby was
	// promoted, since the run's start.
	var lost, crashed, promoted int64
	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		step := func(d time.Duration) bool { return pause(ctx, d) }
		if !step(time.Second) {
			return
		}
		if err := standby.Crash(); err != nil { // the standby's host is lost
			t.Errorf("stop the standby: %v", err)
			return
		}
		lost = since()
		if !step(standbyLostFor) {
			return
		}
		if err := primary.Crash(); err != nil { // then the primary's
			t.Errorf("crash the primary: %v", err)
			return
		}
		crashed = since()
		// The standby comes back with what it had flushed, still a
		// standby (standby.signal), and is promoted.
		if err := standby.Restart(context.Background()); err != nil {
			t.Errorf("restart the standby: %v", err)
			return
		}
		if err := standby.Promote(context.Background()); err != nil {
			t.Errorf("promote the standby: %v", err)
			return
		}
		promoted = since()
	})
	if promoted == 0 {
		t.Fatal("the failover did not happen within the run")
	}
	// Successes answered while the standby was away can only be replays
	// of what it had before: checkHistory finds each on it.
	resumed, duringLoss := time.Duration(-1), 0
	for _, op := range h.ops {
		if op.Output.(bool) && op.Return > lost && op.Return < crashed {
			duringLoss++
		}
		if op.Output.(bool) && op.Return > promoted {
			if d := time.Duration(op.Return - promoted); resumed < 0 || d < resumed {
				resumed = d
			}
		}
	}
	t.Logf("%d successes answered while the standby was lost; the promotion %s after the primary's crash; "+
		"the first sale acknowledged by the promoted standby %s after its promotion (bound %s)",
		duringLoss, time.Duration(promoted-crashed), resumed, failoverResumeMax)
	if resumed < 0 || resumed > failoverResumeMax {
		t.Errorf("sales resumed %s after the promotion, want within %s", resumed, failoverResumeMax)
	}
	checkHistory(t, s, sku, h, promoted, fmt.Sprintf("the synchronous standby lost for %s, then the primary; the standby promoted", standbyLostFor))
}
