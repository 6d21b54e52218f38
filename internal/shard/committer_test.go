package shard

import (
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

func groupItemOf(sku string, idx int32) *groupItem {
	return &groupItem{unit: &stock.Unit{Query: stock.BatchQuery{Shard: stock.ShardKey{SKU: sku, Index: idx}}}, done: make(chan error, 1)}
}

// The lane holds a group back for the writers of the last group that had
// requests queued, and for no one else.
func TestCommitter_GatherWaitsForFollowers(t *testing.T) {
	c := &committer{queue: make(chan *groupItem, 16), stop: make(chan struct{}), followWait: time.Minute}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	follow := map[stock.ShardKey]bool{{SKU: "a", Index: 0}: true, {SKU: "a", Index: 1}: true}

	// Both followers arrive late, one of them after another writer's batch:
	// all three are in the group.
	go func() {
		time.Sleep(100 * time.Microsecond)
		c.queue <- groupItemOf("b", 0)
		c.queue <- groupItemOf("a", 1)
		time.Sleep(100 * time.Microsecond)
		c.queue <- groupItemOf("a", 0)
	}()
	items := c.gather([]*groupItem{groupItemOf("c", 0)}, follow, timer)
	if len(items) != 4 {
		t.Fatalf("group of %d batches, want 4 (the first, another writer's, both followers)", len(items))
	}

	// A follower that never comes costs followWait, not more.
	c.followWait = 20 * time.Millisecond
	start := time.Now()
	items = c.gather([]*groupItem{groupItemOf("a", 0)}, follow, timer)
	if waited := time.Since(start); len(items) != 1 || waited < c.followWait || waited > 10*time.Second {
		t.Fatalf("group of %d after %v, want 1 after about %v", len(items), waited, c.followWait)
	}

	// With every follower in already, or none expected, nothing waits.
	c.queue <- groupItemOf("z", 0)
	items = c.gather([]*groupItem{groupItemOf("a", 0), groupItemOf("a", 1)}, follow, timer)
	if len(items) != 2 || len(c.queue) != 1 {
		t.Fatalf("group of %d with %d left queued, want 2 and 1: a complete group took more", len(items), len(c.queue))
	}
}

// The writers a lane waits for are those with requests queued, read before
// their answers go out.
func TestCommitter_Followers(t *testing.T) {
	queued := func(n int) func() int { return func() int { return n } }
	a, b, c := groupItemOf("a", 0), groupItemOf("a", 1), groupItemOf("b", 0)
	a.queued, b.queued = queued(3), queued(0) // c: none (a batch of a test)
	got := followers([]*groupItem{a, b, c})
	if len(got) != 1 || !got[stock.ShardKey{SKU: "a", Index: 0}] {
		t.Fatalf("followers = %v, want only a/0 (the writer with requests queued)", got)
	}
}

// A lane with a group delay holds a group that is not full for batches
// that arrive within it, sends a full group at once, and holds an empty
// wait for the delay only.
func TestCommitter_Linger(t *testing.T) {
	c := &committer{queue: make(chan *groupItem, 2*groupUnitsMax), stop: make(chan struct{}), groupDelay: time.Minute}
	timer := time.NewTimer(time.Hour)
	timer.Stop()

	// Three batches arrive one by one after the group's first; the group
	// fills to the cap and goes without waiting for the minute.
	go func() {
		for i := range groupUnitsMax - 1 {
			if i < 3 {
				time.Sleep(time.Millisecond)
			}
			c.queue <- groupItemOf("b", int32(i))
		}
	}()
	start := time.Now()
	items := c.linger([]*groupItem{groupItemOf("a", 0)}, timer)
	if len(items) != groupUnitsMax || time.Since(start) > 10*time.Second {
		t.Fatalf("group of %d after %v, want %d (full) long before the delay", len(items), time.Since(start), groupUnitsMax)
	}

	// Nothing more comes: the group goes after the delay, not later.
	c.groupDelay = 20 * time.Millisecond
	start = time.Now()
	items = c.linger([]*groupItem{groupItemOf("a", 0)}, timer)
	if waited := time.Since(start); len(items) != 1 || waited < c.groupDelay || waited > 10*time.Second {
		t.Fatalf("group of %d after %v, want 1 after about %v", len(items), waited, c.groupDelay)
	}
}

// The server's group delay reaches its committers, bounded.
func TestServer_GroupDelay(t *testing.T) {
	for _, tc := range []struct{ set, want time.Duration }{
		{0, 0}, {500 * time.Microsecond, 500 * time.Microsecond}, {time.Hour, GroupDelayMax}, {-time.Second, 0},
	} {
		s := New(Config{ServerID: "gd", GroupDelay: tc.set})
		for name, d := range s.dbs {
			if d.committer.groupDelay != tc.want {
				t.Errorf("GroupDelay %v: database %s's committer waits %v, want %v", tc.set, name, d.committer.groupDelay, tc.want)
			}
			d.committer.close()
		}
	}
}
