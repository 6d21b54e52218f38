package shard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shardstock/shardstock/internal/batch"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of a writer.
const (
	// queueLenMax bounds each shard's queue; a full queue answers
	// SHARD_UNAVAILABLE at once (back-pressure, safe to retry).
	queueLenMax = 4096
	// batchSizeMax caps smart batching: a batch is what queued while the
	// previous transaction ran, up to this many requests.
	batchSizeMax = 512
	// batchAttemptsMax bounds reruns of one batch (conflicts, lost
	// connections) before its requests are answered SHARD_UNAVAILABLE.
	batchAttemptsMax = 5
	// batchTimeout bounds one batch transaction.
	batchTimeout = 10 * time.Second
	// writerIdleMax: a writer with nothing to do for this long is dropped
	// with its cached row (Server.dropIdle), so that the shards a sale
	// touched once cost no memory after it.
	writerIdleMax = time.Minute
	// writerParkAfter: a writer with nothing to do for this long ends its
	// goroutine and keeps its state (parks); the next request starts one
	// again. Thousands of goroutines waiting idle (a writer's for every
	// shard touched in the last minute) kept Go's starting stack, the average
	// its GC finds in use, at its least: every goroutine net/http starts
	// for a call then grew its stack by copying, 6% of the allocator's CPU
	// on model C (docs/bench-log/2026-12-06-front.md). A busy shard's
	// writer never waits this long.
	writerParkAfter = 50 * time.Millisecond
	// heldMax bounds the reservations a writer remembers held; commits and
	// releases of the others read theirs.
	heldMax = 4096
	// sweepMax bounds how many due reservations one sweep expires.
	sweepMax = 256
	// retryBackoff is the pause before rerunning a batch after an error.
	retryBackoff = 20 * time.Millisecond
)

// pending is one request waiting in a writer's queue.
type pending struct {
	req  *stock.Request
	done chan stock.Result // buffered 1
}

// writer is the only writer of one shard: it owns the in-memory copy of the
// row and drains its queue in batches, one transaction per batch.
type writer struct {
	srv *Server
	// db is the shard's database, set by bind before the first batch.
	db    *database
	key   stock.ShardKey
	fence stock.Fence
	queue *batch.Queue[*pending]
	stop  chan struct{} // closed: stop after the current batch
	// loaded: counts is the row as of the last commit. A new writer has no
	// copy: its first batch reads the row inside its own transaction.
	loaded bool
	counts stock.Counts
	sku    *stock.SKU // as of the last batch; for the read-only path
	// committed is counts as of the last commit, for readers on other
	// goroutines (GetShards answers from memory).
	committed atomic.Pointer[stock.Counts]
	// suspect: the row turned out not to be what this writer held, and
	// the check against the ledger could not be made yet: make it before
	// the next batch.
	suspect bool
	// seeded: counts is a seed (a sibling's read, Server.seeds), not
	// known committed: only a speculative write may start from it, and
	// nothing is answered from it without a transaction.
	seeded bool
	// held are the reservations this writer made and has not ended
	// since, by id (at most heldMax): commits and releases of them can be
	// decided before any read (stock.BatchQuery.KnownHeld). Forgotten with
	// the writer's copy of its row, when what was committed is not known.
	held map[string]*stock.Reservation
	// sinceCheckpoint counts the entries this writer appended since the
	// shard's last checkpoint (-1 when that is not known): it says which
	// write carries the next one (ledger.CheckpointFor).
	sinceCheckpoint int
	// running: a goroutine serves the writer (srv.mu); when it parks, the
	// next request starts another, and at most one runs at a time.
	running bool
	// lastBatch: when the writer last ran a batch (bound first), read by
	// Server.dropIdle once it parked. The running goroutine's.
	lastBatch time.Time
	// goroutines counts the goroutines serving the writer: at most 1 (a
	// test reads it). A parking goroutine leaves the count under srv.mu,
	// before the next request may start another.
	goroutines atomic.Int32
}

func (w *writer) setCounts(c stock.Counts) {
	w.loaded, w.seeded = true, false
	w.counts = c
	w.committed.Store(&c)
}

// forget drops the writer's copy of its row, and what it knew of its
// reservations: the next batch reads the row.
func (w *writer) forget() {
	w.loaded, w.seeded, w.held = false, false, nil
	w.sinceCheckpoint = -1 // a write in doubt may or may not have made one
}

// remember notes the reservations a committed write made and ended.
func (w *writer) remember(write *stock.BatchWrite) {
	for _, e := range write.Ended {
		delete(w.held, e.ID)
	}
	for _, x := range write.Extended {
		if r := w.held[x.ID]; r != nil {
			c := *r
			c.ExpiresAt = x.ExpiresAt.Truncate(time.Microsecond) // as stored
			w.held[x.ID] = &c
		}
	}
	for _, r := range write.NewReservations {
		if len(w.held) >= heldMax {
			break
		}
		if w.held == nil {
			w.held = map[string]*stock.Reservation{}
		}
		c := *r
		c.ExpiresAt = c.ExpiresAt.Truncate(time.Microsecond) // as stored
		c.CreatedAt = c.CreatedAt.Truncate(time.Microsecond)
		w.held[c.ID] = &c
	}
}

// knownHeld returns the reservations ids as the writer knows them held, or
// nil unless it knows them all.
func (w *writer) knownHeld(ids []string) map[string]*stock.Reservation {
	if len(ids) == 0 || len(w.held) == 0 {
		return nil
	}
	known := make(map[string]*stock.Reservation, len(ids))
	for _, id := range ids {
		r := w.held[id]
		if r == nil {
			return nil
		}
		known[id] = r
	}
	return known
}

// seed starts the writer from a sibling's read of its row.
func (w *writer) seed(sd shardSeed) {
	w.loaded, w.seeded = true, true
	w.counts, w.sku = sd.counts, sd.sku
}

func newWriter(s *Server, key stock.ShardKey, epoch int64) *writer {
	return &writer{
		srv:   s,
		key:   key,
		fence: stock.Fence{Partition: key.Partition(), Epoch: epoch, ServerID: s.id},
		queue: batch.NewQueue[*pending](queueLenMax),
		stop:  make(chan struct{}),
		// Its predecessor's entries since the last checkpoint are not
		// known: its first write has the database count them.
		sinceCheckpoint: -1,
	}
}

// run serves batches until stopped, parked, or its shard turns out not to
// exist. It is started by a request for a writer that runs no goroutine
// (Server.enqueue); the writer's first run binds it to its database, and
// its first batch reads the row (LoadShard) in its transaction. A writer
// idle for its server's parkAfter ends the goroutine (Server.park) and
// keeps its row; one idle for idleMax is dropped.
func (w *writer) run() {
	w.goroutines.Add(1)
	parked := false // park counted this goroutine out, under the lock
	defer func() {
		if !parked {
			w.goroutines.Add(-1)
		}
	}()
	if w.db == nil { // not bound yet: a writer whose bind failed was removed
		if r, ok := w.bind(); !ok {
			w.srv.remove(w)
			w.drain(r)
			return
		}
		w.lastBatch = time.Now()
	}
	idle := time.NewTimer(w.srv.parkAfter)
	defer idle.Stop()
	for {
		// A stop wins over queued work: Lose means no new batch.
		select {
		case <-w.stop:
			w.drain(unavailable("shard server gave up the shard's partition"))
			return
		default:
		}
		select {
		case <-w.queue.Ready():
		case <-w.stop:
			w.drain(unavailable("shard server gave up the shard's partition"))
			return
		case <-idle.C:
			if parked = w.srv.park(w); parked {
				return
			}
			idle.Reset(w.srv.parkAfter)
			continue
		}
		reqs := w.queue.Take(w.srv.batchMax)
		if len(reqs) == 0 {
			continue
		}
		switch w.apply(reqs) {
		case writerStop:
			w.srv.remove(w)
			w.drain(unavailable("shard writer stopped"))
			return
		case writerNoShard:
			w.srv.remove(w)
			w.drainFunc(w.noShard)
			return
		}
		w.lastBatch = time.Now()
		idle.Reset(w.srv.parkAfter)
	}
}

// bind finds the database that holds the shard and makes sure the
// writer's partition is taken over there at the writer's epoch (Acquire
// does it in every database that answered then; a database that did not
// is taken over here, on first use). On failure r answers the queue.
func (w *writer) bind() (r stock.Result, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	name, err := w.srv.locate(ctx, w.key.SKU)
	if err != nil {
		w.srv.log.Warn("locating a shard's database", "shard", w.key.String(), "err", err)
		return stock.ErrResult(err, unavailable("database unavailable; retry with the same key").Err), false
	}
	d := w.srv.dbs[name]
	if d == nil {
		return stock.Result{Err: unconfigured(name)}, false
	}
	w.db = d
	if w.srv.fencedIn(d, w.fence.Partition, w.fence.Epoch) {
		return stock.Result{}, true
	}
	if err := w.srv.takeOver(ctx, d, w.fence.Partition, w.fence.Epoch); err != nil {
		w.srv.log.Warn("taking a partition over on first use", "shard", w.key.String(), "err", err)
		return unavailable(fmt.Sprintf("database %q unavailable; retry with the same key", name)), false
	}
	return stock.Result{}, true
}

// noShard answers a request for a shard that does not exist.
func (w *writer) noShard(r *stock.Request) stock.Result {
	if r.Kind == stock.OpCommit || r.Kind == stock.OpRelease {
		return stock.Result{Err: stock.Errorf(stock.CodeReservationNotFound, "no reservation %s", quote(r.ReservationID))}
	}
	return stock.Result{Err: stock.Errorf(stock.CodeSKUNotFound, "sku %q has no shard %d", w.key.SKU, w.key.Index)}
}

// What a writer does after a batch.
type writerNext uint8

const (
	writerGoOn    writerNext = iota
	writerStop               // fenced, halted or broken: stop
	writerNoShard            // the shard does not exist: stop, answer the rest so
)

// apply runs one batch and answers every request in it, and says whether
// the writer goes on.
func (w *writer) apply(batch []*pending) writerNext {
	start := time.Now()
	reqs := make([]*stock.Request, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	results, keep := w.decide(reqs)
	for i, p := range batch {
		p.done <- results[i]
	}
	w.srv.metrics.observeBatch(len(batch), time.Since(start), results)
	return keep
}

func (w *writer) decide(reqs []*stock.Request) ([]stock.Result, writerNext) {
	if w.suspect {
		if next, r, resumed := w.recheck(nil); !resumed {
			return all(len(reqs), r), next
		}
	}
	if w.loaded && !w.seeded && onlyWarm(reqs) {
		// Warm already: the row was read in a transaction of this writer.
		return all(len(reqs), stock.Result{Warmed: true, Available: w.hint()}), writerGoOn
	}
	if w.refusable(reqs) {
		if results, err := w.readOnly(reqs); err == nil {
			return results, writerGoOn
		}
	}
	b := &batchRun{w: w, reqs: reqs}
	b.q, b.sweep = query(w.key, reqs)
	b.q.LoadShard, b.q.Seeded = !w.loaded, w.seeded
	var err error
	for attempt := 0; attempt < batchAttemptsMax; attempt++ {
		if attempt > 0 && !w.pause(retryBackoff*time.Duration(attempt)) {
			return all(len(reqs), unavailable("shard server gave up the shard's partition")), writerStop
		}
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		b.q.KnownSKU, b.q.Seeded, b.q.KnownHeld = w.sku, w.seeded, w.knownHeld(b.q.ReservationIDs)
		// A writer's first commit, from its row or a seed: the shard
		// serves (a halted gauge of an earlier halt goes).
		loading := b.q.LoadShard || b.q.Seeded
		err = w.db.committer.commit(ctx, w.fence, b.q, b.decide, w.queue.Len)
		cancel()
		if err == nil {
			return b.committed(loading)
		}
		if results, next, done := b.failed(err, attempt); done {
			return results, next
		}
	}
	w.srv.log.Warn("batch gave up", "shard", w.key.String(), "err", err)
	return all(len(reqs), unavailable("database unavailable; retry with the same key")), writerGoOn
}

// pause waits d before a batch is rerun, unless the writer is stopped
// meanwhile (false): a stop wins over a rerun, as over queued work.
func (w *writer) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.stop:
		return false
	}
}

// batchRun is one batch through its attempts: what it reads, and what its
// last decision was.
type batchRun struct {
	w     *writer
	reqs  []*stock.Request
	q     stock.BatchQuery
	sweep bool
	// Set by decide, the last time it ran.
	results   []stock.Result
	write     *stock.BatchWrite
	missing   bool   // the shard does not exist
	halted    string // the loaded row says the shard is halted, and why
	rechecked bool   // the row was reloaded and checked once already
	siblings  []stock.ShardRow
}

// decide is the batch's stock.Decide: it runs inside the transaction,
// perhaps more than once.
func (b *batchRun) decide(read *stock.BatchRead) (*stock.BatchWrite, error) {
	w := b.w
	counts := w.counts
	b.missing, b.halted, b.siblings = false, "", nil
	if read.ShardRead {
		b.siblings = read.Siblings
		if read.Counts == nil {
			b.missing = true
			b.write, b.results = &stock.BatchWrite{}, make([]stock.Result, len(b.reqs))
			for i, r := range b.reqs {
				b.results[i] = w.noShard(r)
			}
			return b.write, nil
		}
		if read.HaltReason != "" {
			b.halted = read.HaltReason
			b.write, b.results = &stock.BatchWrite{}, all(len(b.reqs), haltedResult(w.key))
			return b.write, nil
		}
		counts = *read.Counts
	}
	var err error
	b.write, b.results, err = stock.EvaluateBatch(w.key, counts, b.reqs, read, b.sweep)
	w.sku = read.SKU
	if err == nil {
		b.write.Checkpoint = ledger.CheckpointFor(w.sinceCheckpoint, len(b.write.Ledger))
	}
	return b.write, err
}

// committed answers a batch whose transaction committed (or that had
// nothing to write).
func (b *batchRun) committed(loaded bool) ([]stock.Result, writerNext) {
	w := b.w
	switch {
	case b.missing:
		return b.results, writerNoShard
	case b.halted != "":
		w.srv.halt(w, b.halted, false)
		return b.results, writerStop
	}
	w.setCounts(b.write.To)
	w.remember(b.write)
	w.srv.metrics.observeTokens(b.write.Ledger)
	if b.write.Checkpoint != stock.CheckpointNone {
		w.sinceCheckpoint = 0 // after CheckpointIfDue, fewer than ledger.CheckpointEntries more
	} else {
		w.sinceCheckpoint += len(b.write.Ledger)
	}
	if loaded {
		w.srv.running(w.key)
	}
	if len(b.siblings) > 0 {
		w.srv.plant(w.key.SKU, w.sku, b.siblings)
	}
	return b.results, writerGoOn
}

// failed handles an attempt's error: done with the answers and what the
// writer does next, or not done (rerun the batch).
func (b *batchRun) failed(err error, attempt int) (results []stock.Result, next writerNext, done bool) {
	w, n := b.w, len(b.reqs)
	switch {
	case errors.Is(err, stock.ErrConflict):
		w.rerun("conflict", attempt)
		return nil, 0, false // a concurrent batch took a key or a quota: the rerun sees it
	case errors.Is(err, stock.ErrFenced):
		w.srv.log.Warn("batch fenced: another server owns the partition", "shard", w.key.String(), "err", err)
		w.srv.fenced(w)
		return all(n, unavailable("shard moved to another server")), writerStop, true
	case errors.Is(err, stock.ErrDiverged), errors.Is(err, stock.ErrInvariant):
		// The row is not what this writer held (a lost commit's outcome
		// misjudged, a second writer, a bug). Once per batch: reload it
		// under the fence and, if the ledger accounts for it, go on from
		// it; else, or if it happens again at once, halt the shard.
		if !b.rechecked {
			b.rechecked = true
			w.srv.log.Warn("shard row is not the writer's copy; checking it against the ledger", "shard", w.key.String(), "err", err)
			if next, r, resumed := w.recheck(err); !resumed {
				return all(n, r), next, true
			}
			b.q.LoadShard = false // counted as shardstock_shard_divergences_total{outcome="recovered"}
			return nil, 0, false
		}
		reason := fmt.Sprintf("the row diverged again right after it was reloaded and checked against the ledger: %v", err)
		w.srv.log.Error("INVARIANT: halting the shard", "shard", w.key.String(), "reason", reason)
		w.srv.halt(w, reason, true)
		return all(n, haltedResult(w.key)), writerStop, true
	case errors.Is(err, stock.ErrOutcomeUnknown):
		// Whether the batch committed is not known: reload the row and
		// tell everyone to retry with the same key, which is safe.
		w.srv.log.Warn("batch outcome unknown", "shard", w.key.String(), "err", err)
		w.forget() // the next batch reads the row again
		return all(n, unavailable("database connection lost; retry with the same key")), writerGoOn, true
	case errors.Is(err, stock.ErrNotCommitted):
		w.srv.log.Debug("batch not committed; rerunning", "shard", w.key.String(), "attempt", attempt, "err", err)
		w.forget() // the rerun reads the row again
		b.q.LoadShard = true
		w.rerun("not_committed", attempt)
		return nil, 0, false
	}
	w.srv.log.Error("batch failed", "shard", w.key.String(), "err", err)
	return all(n, unavailable("batch failed")), writerGoOn, true
}

// rerun counts a batch run again after a failed attempt, by cause; the
// last attempt's failure is not followed by a rerun.
func (w *writer) rerun(cause string, attempt int) {
	if attempt+1 < batchAttemptsMax {
		w.srv.metrics.reruns.WithLabelValues(cause).Inc()
	}
}

// recheck reloads the shard's row under the writer's fence and checks it
// against the ledger (its latest checkpoint plus the entries after it), after
// cause showed that the writer's copy was wrong. When the ledger accounts
// for the row, the row becomes the writer's copy and the writer goes on
// (writerGoOn, suspect cleared). When it does not, the shard is halted: a
// write that is not in the ledger is a bug that a person must look at.
// When the check cannot be made (the database is down), the writer stays
// suspect and makes it before its next batch. resumed: the writer goes on
// from the row; else r answers the batch and next says what the writer does.
func (w *writer) recheck(cause error) (next writerNext, r stock.Result, resumed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	c, err := w.db.store.CheckShard(ctx, w.fence, w.key)
	switch {
	case errors.Is(err, stock.ErrFenced):
		w.srv.fenced(w)
		return writerStop, unavailable("shard moved to another server"), false
	case stock.CodeOf(err) == stock.CodeSKUNotFound:
		return writerNoShard, unavailable("shard no longer exists"), false
	case err != nil:
		w.srv.log.Warn("shard check against the ledger failed; retrying before the next batch", "shard", w.key.String(), "err", err)
		w.suspect = true
		w.forget()
		return writerGoOn, unavailable("database unavailable; retry with the same key"), false
	case c.HaltReason != "":
		w.srv.halt(w, c.HaltReason, false)
		return writerStop, haltedResult(w.key), false
	case !c.Consistent():
		reason := fmt.Sprintf("row %+v is not its opening balance plus its ledger %+v (found after: %v)", c.Row, c.Ledger, cause)
		w.srv.log.Error("INVARIANT: shard row disagrees with its ledger; halting the shard", "shard", w.key.String(), "reason", reason)
		w.srv.halt(w, reason, true)
		return writerStop, haltedResult(w.key), false
	}
	w.srv.log.Warn("shard row reloaded; its ledger accounts for it: resuming", "shard", w.key.String(), "was", w.counts, "row", c.Row)
	w.srv.metrics.divergences.WithLabelValues("recovered").Inc()
	w.suspect = false
	w.setCounts(c.Row)
	w.held = nil // what ended meanwhile is not known either
	return writerGoOn, stock.Result{}, true
}

// haltedResult answers a request for a halted shard.
func haltedResult(k stock.ShardKey) stock.Result {
	return unavailable("shard " + k.String() + " is halted until an operator resumes it (GetStock shows why)")
}

// refusable reports whether no request of the batch can change the shard:
// all are reserves or deducts larger than what is available. Such a batch
// needs no transaction, only the read that tells replays apart (readOnly),
// unless the SKU's configuration refuses one of them.
func (w *writer) refusable(reqs []*stock.Request) bool {
	if w.sku == nil || !w.loaded || w.seeded {
		return false
	}
	for _, r := range reqs {
		if (r.Kind != stock.OpReserve && r.Kind != stock.OpDeduct) || r.Quantity <= w.counts.Available {
			return false
		}
	}
	return true
}

// readOnly answers a refusable batch: one indexed read of its keys, then the
// same planner, which must write nothing.
func (w *writer) readOnly(reqs []*stock.Request) ([]stock.Result, error) {
	q, _ := query(w.key, reqs)
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	ops, err := w.db.store.LookupOperations(ctx, w.key.SKU, q.Keys)
	if err != nil {
		return nil, err
	}
	// No clock: this read is not a batch transaction, and the sale
	// window is decided only by one's database clock (stock.SKU.Refuse).
	// Every request here is refused either way, for stock if not by the
	// window.
	read := &stock.BatchRead{SKU: w.sku, Ops: ops}
	write, results, err := stock.EvaluateBatch(w.key, w.counts, reqs, read, false)
	if err != nil || !write.Empty() {
		// Cannot happen: every request asks for more than is available.
		// Let the transactional path decide instead.
		return nil, fmt.Errorf("shard: a refusable batch planned a write: %v", err)
	}
	// The row is this writer's own (fenced), but its copy of the SKU is
	// as of its last batch, and UpdateSku changes the SKU without telling
	// it. So this path answers only what the keys' read and the row
	// decide: a recorded key's result, or OUT_OF_STOCK. A refusal by the
	// SKU's configuration (paused, max_per_order, a customer's limit,
	// admission) from that copy could outlive the change for as long as
	// the writer lives, and an allocator takes it as final where it moves
	// on from OUT_OF_STOCK: such a batch is decided by a transaction,
	// which reads the SKU.
	for i, res := range results {
		if res.Err != nil && res.Err.Code != stock.CodeOutOfStock && ops[reqs[i].Key] == nil {
			return nil, errConfigRefusal
		}
	}
	return results, nil
}

// errConfigRefusal: a read-only batch would refuse a request by the
// writer's copy of the SKU's configuration; a transaction decides it.
var errConfigRefusal = errors.New("shard: a refusal by the SKU's configuration is read in a transaction")

// onlyWarm reports whether every request of a batch is a warm-up.
func onlyWarm(reqs []*stock.Request) bool {
	for _, r := range reqs {
		if r.Kind != stock.OpWarm {
			return false
		}
	}
	return true
}

// hint is the available count the writer's answers carry: none on a shard
// being retired, as stock.EvaluateBatch answers.
func (w *writer) hint() int64 {
	if w.sku != nil && w.key.Index >= w.sku.Shards {
		return 0
	}
	return w.counts.Available
}

// query lists what a batch must read.
func query(key stock.ShardKey, reqs []*stock.Request) (stock.BatchQuery, bool) {
	q := stock.BatchQuery{Shard: key}
	sweep := false
	customers := map[string]bool{}
	for _, r := range reqs {
		switch {
		case r.Kind == stock.OpRefund:
			// A refund reads its sale (a deduct's operation, or a
			// reservation) and what was refunded of it.
			q.Keys = append(q.Keys, r.Key)
			q.Sales = append(q.Sales, r.Original.ID())
			if r.Original.DeductKey != "" {
				q.Keys = append(q.Keys, r.Original.DeductKey)
			} else {
				q.ReservationIDs = append(q.ReservationIDs, r.Original.ReservationID)
			}
		case r.Kind.Keyed():
			q.Keys = append(q.Keys, r.Key)
			if r.OrderRef != "" && (r.Kind == stock.OpReserve || r.Kind == stock.OpDeduct) {
				q.Orders = append(q.Orders, stock.OrderName(r.OrderRef, r.Kind))
			}
			if r.CustomerRef != "" && !customers[r.CustomerRef] && (r.Kind == stock.OpReserve || r.Kind == stock.OpDeduct) {
				customers[r.CustomerRef] = true
				q.Customers = append(q.Customers, r.CustomerRef)
			}
		case r.Kind == stock.OpCommit || r.Kind == stock.OpRelease || r.Kind == stock.OpExtend:
			q.ReservationIDs = append(q.ReservationIDs, r.ReservationID)
			q.Extending = q.Extending || r.Kind == stock.OpExtend
		case r.Kind == stock.OpTransferOut || r.Kind == stock.OpTransferIn:
			q.TransferIDs = append(q.TransferIDs, r.TransferID)
		case r.Kind == stock.OpExpire:
			sweep = true
		}
	}
	if sweep {
		q.SweepMax = sweepMax
	}
	return q, sweep
}

// drain answers everything still queued with r.
func (w *writer) drain(r stock.Result) {
	w.drainFunc(func(*stock.Request) stock.Result { return r })
}

// drainFunc answers everything still queued with answer(request).
func (w *writer) drainFunc(answer func(*stock.Request) stock.Result) {
	for {
		ps := w.queue.Take(queueLenMax)
		if len(ps) == 0 {
			return
		}
		for _, p := range ps {
			p.done <- answer(p.req)
		}
	}
}

func unavailable(msg string) stock.Result {
	return stock.Result{Err: stock.Errorf(stock.CodeShardUnavailable, "%s", msg)}
}

func all(n int, r stock.Result) []stock.Result {
	out := make([]stock.Result, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func quote(s string) string { return "\"" + s + "\"" }
