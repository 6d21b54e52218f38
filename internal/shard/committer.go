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
}

type groupItem struct {
	unit *stock.Unit
	done chan error // buffered 1
}

func newCommitter(s *Server, d *database) *committer {
	c := &committer{srv: s, db: d, queue: make(chan *groupItem, committerQueueLenMax), stop: make(chan struct{})}
	for range committerLanes {
		go c.lane()
	}
	return c
}

// commit runs one shard's batch within some group and returns its outcome,
// as postgres.Batch would.
func (c *committer) commit(ctx context.Context, f stock.Fence, q stock.BatchQuery, decide stock.Decide) error {
	it := &groupItem{unit: &stock.Unit{Fence: f, Query: q, Decide: decide}, done: make(chan error, 1)}
	select {
	case c.queue <- it:
	case <-ctx.Done():
		return stock.ErrNotCommitted
	}
	return <-it.done // a lane always answers
}

func (c *committer) lane() {
	for {
		var first *groupItem
		select {
		case first = <-c.queue:
		case <-c.stop:
			return
		}
		c.run(batch.Fill(first, c.queue, groupUnitsMax))
	}
}

// run commits items as one group. When the group fails for a reason that
// one unit may have caused (a key or quota taken meanwhile, a diverged row,
// an invariant), every unit is run alone, so that one shard's trouble is
// not everyone's.
func (c *committer) run(items []*groupItem) {
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
	if err != nil && len(items) > 1 && (errors.Is(err, stock.ErrConflict) || errors.Is(err, stock.ErrDiverged) || errors.Is(err, errInvariant)) {
		for _, it := range items {
			it.unit.Err = nil
			e := c.db.store.Group(ctx, []*stock.Unit{it.unit})
			it.done <- errors.Join(e, it.unit.Err)
		}
		return
	}
	for _, it := range items {
		if err != nil {
			it.done <- err
			continue
		}
		it.done <- it.unit.Err
	}
}

func (c *committer) close() { close(c.stop) }
