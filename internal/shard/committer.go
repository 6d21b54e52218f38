package shard

import (
	"context"
	"errors"
	"time"

	"github.com/shardstock/shardstock/internal/batch"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of group commit.
const (
	// committerLanes is how many group transactions a server runs at once.
	committerLanes = 1
	// groupUnitsMax caps the shard batches in one group transaction.
	groupUnitsMax = 64
	// committerQueueLenMax bounds the batches waiting for a lane; every
	// writer has at most one batch waiting, so this bounds writers too.
	committerQueueLenMax = 4096
	// followWaitMax bounds how long a lane holds a group back for the
	// writers of the last group that had requests queued when it ended
	// (see lane). They submit as soon as they have answered theirs, with
	// no I/O in between, so the wait is a few scheduler turns; the bound
	// is for a writer that stopped instead.
	followWaitMax = time.Millisecond
)

// database is one of the databases a server writes to: its store, its
// committer (a group transaction runs in one database) and the partitions
// taken over in it (under Server.mu).
type database struct {
	name      string
	store     Store
	committer *committer
	fenced    map[int32]int64 // partition -> epoch
}

// committer runs the batches of this server's writers in shared
// transactions: each lane takes whatever batches queued while its last
// transaction ran (smart batching once more, across shards) and commits them
// together. A hot SKU's shards, or many cold shards, then share one commit
// and one set of statements instead of one each.
type committer struct {
	srv   *Server
	db    *database
	queue chan *groupItem
	stop  chan struct{}
	// followWait is followWaitMax; longer in tests.
	followWait time.Duration
	// groupDelay is how long a lane holds a group that is not full for
	// more batches (Config.GroupDelay); 0: not at all.
	groupDelay time.Duration
}

type groupItem struct {
	unit *stock.Unit
	done chan error // buffered 1
	// queued reports how many requests the unit's writer has waiting; a
	// writer with some submits its next batch as soon as it has this one's
	// answer.
	queued func() int
}

func newCommitter(s *Server, d *database) *committer {
	c := &committer{srv: s, db: d, queue: make(chan *groupItem, committerQueueLenMax), stop: make(chan struct{}), followWait: followWaitMax}
	c.groupDelay = s.groupDelay
	for range committerLanes {
		go c.lane()
	}
	return c
}

// commit runs one shard's batch within some group and returns its outcome,
// as postgres.Batch would.
func (c *committer) commit(ctx context.Context, f stock.Fence, q stock.BatchQuery, decide stock.Decide, queued func() int) error {
	it := &groupItem{unit: &stock.Unit{Fence: f, Query: q, Decide: decide}, done: make(chan error, 1), queued: queued}
	select {
	case c.queue <- it:
	case <-ctx.Done():
		return stock.ErrNotCommitted
	}
	return <-it.done // a lane always answers
}

// lane runs groups one after another. A group is whatever queued while the
// last one ran, and also the next batch of each writer of the last group
// that had requests waiting when it ended: such a writer was blocked on
// the last group, so without the wait its batch would miss this group and
// open the next, and under load the writers would split into two halves
// that alternate, each paying a group's fixed statements and commit for
// half the requests (docs/bench-log/2026-12-04.md measured the difference). The
// wait is for those writers only, and ends when all have submitted or
// followWaitMax passed: at low load nothing is queued, and nothing waits.
func (c *committer) lane() {
	var follow map[stock.ShardKey]bool // writers of the last group with requests queued
	timer := time.NewTimer(c.followWait)
	timer.Stop()
	for {
		var first *groupItem
		select {
		case first = <-c.queue:
		case <-c.stop:
			return
		}
		items := batch.Fill(first, c.queue, groupUnitsMax)
		if len(follow) > 0 {
			items = c.gather(items, follow, timer)
		}
		if c.groupDelay > 0 && len(items) < groupUnitsMax {
			items = c.linger(items, timer)
		}
		follow = c.run(items)
	}
}

// linger adds to items whatever queues within groupDelay, until the group
// is full. Below the peak a group carries few requests and its fixed cost
// (the statement's executor, BEGIN and COMMIT, the WAL flush) is most of
// Postgres's share of each; holding it back a fraction of a millisecond
// shares that cost by more. At the peak groups are full or batches keep
// queueing while the lane waits, so the wait buys little there. The
// figures: docs/benchmarks.md, "-group-delay".
func (c *committer) linger(items []*groupItem, timer *time.Timer) []*groupItem {
	return c.collect(items, timer, c.groupDelay, nil)
}

// collect adds to items the batches that queue within d, until the group
// is full or complete (if set) says it is after a batch came.
func (c *committer) collect(items []*groupItem, timer *time.Timer, d time.Duration, complete func(*groupItem) bool) []*groupItem {
	timer.Reset(d)
	defer timer.Stop()
	for len(items) < groupUnitsMax {
		select {
		case it := <-c.queue:
			items = append(items, it)
			if complete != nil && complete(it) {
				return items
			}
		case <-timer.C:
			return items
		case <-c.stop:
			return items
		}
	}
	return items
}

// followers returns the writers of items that have requests queued. Read
// before their answers are delivered: after, a writer may have taken its
// queue already and be planning its next batch, and would be missed.
func followers(items []*groupItem) map[stock.ShardKey]bool {
	follow := map[stock.ShardKey]bool{}
	for _, it := range items {
		if it.queued != nil && it.queued() > 0 {
			follow[it.unit.Query.Shard] = true
		}
	}
	return follow
}

// gather adds to items the batches of the writers in follow as they
// arrive (and any other batch queued meanwhile), until every one of them
// is in, the group is full, or followWait has passed.
func (c *committer) gather(items []*groupItem, follow map[stock.ShardKey]bool, timer *time.Timer) []*groupItem {
	missing := len(follow)
	for _, it := range items {
		if follow[it.unit.Query.Shard] {
			missing--
		}
	}
	if missing <= 0 || len(items) >= groupUnitsMax {
		return items
	}
	return c.collect(items, timer, c.followWait, func(it *groupItem) bool {
		if follow[it.unit.Query.Shard] {
			missing--
		}
		return missing <= 0
	})
}

// run commits items as one group. When the group fails for a reason that
// one unit may have caused (a key or quota taken meanwhile, a diverged row,
// an invariant), every unit is run alone, so that one shard's trouble is
// not everyone's. It returns the writers of items that had requests
// queued when the group ended (followers).
func (c *committer) run(items []*groupItem) (follow map[stock.ShardKey]bool) {
	units := make([]*stock.Unit, len(items))
	for i, it := range items {
		units[i] = it.unit
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	start := time.Now()
	err := c.db.store.Group(ctx, units)
	c.srv.metrics.groupSize.Observe(float64(len(units)))
	c.srv.metrics.groupDuration.Observe(time.Since(start).Seconds())
	if err != nil && len(items) > 1 && (errors.Is(err, stock.ErrConflict) || errors.Is(err, stock.ErrDiverged) || errors.Is(err, stock.ErrInvariant)) {
		for _, it := range items {
			it.unit.Err = nil
			e := c.db.store.Group(ctx, []*stock.Unit{it.unit})
			it.done <- errors.Join(e, it.unit.Err)
		}
		return nil // each has been answered on its own: they follow whenever they do
	}
	follow = followers(items)
	for _, it := range items {
		if err != nil {
			it.done <- err
			continue
		}
		it.done <- it.unit.Err
	}
	return follow
}

func (c *committer) close() { close(c.stop) }
