// Package shard is the shard server: it owns partitions, keeps one writer
// per active shard, batches requests into fenced, ledgered transactions and
// sweeps expired reservations through the same writers.
package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of the server.
const (
	sweepInterval = 500 * time.Millisecond
	// dropIdleInterval: how often parked writers idle for writerIdleMax
	// are dropped (dropIdle). It looks at every writer under the server's
	// lock, so not at every sweep.
	dropIdleInterval = 10 * time.Second
	sweepShardsMax   = 1000
	// transferStaleAge is how long a transfer may sit half-way before the
	// sweep finishes it.
	transferStaleAge = 5 * time.Second
	// pruneInterval is how often the server deletes old commit marks
	// (postgres.PruneCommitMarks bounds each pass).
	pruneInterval = time.Minute
	// haltRecheckInterval is how long a halted shard is refused from
	// memory before a writer reads its row again (at most one read per
	// halted shard per interval).
	haltRecheckInterval = time.Second
)

// Config configures a Server.
type Config struct {
	ServerID string
	// DB is the one database, when DBs is nil.
	DB Store
	// DBs are the databases by name when SKUs are placed on several, and
	// Locate names the one that holds a SKU (internal/dbset.Set.Locate).
	DBs    map[string]Store
	Locate func(ctx context.Context, sku string) (string, error)
	Logger *slog.Logger
	// Registerer takes the server's metrics; nil: none registered.
	Registerer prometheus.Registerer
	// GroupDelay is how long a group transaction that is not full waits
	// for more shard batches before it is sent (at most GroupDelayMax):
	// CPU for latency below the peak. 0, the default: it is sent at once.
	GroupDelay time.Duration
}

// GroupDelayMax bounds Config.GroupDelay: a longer wait is a mistake, not
// a trade.
const GroupDelayMax = 10 * time.Millisecond

// Server is one shard server. It implements topology.Owner.
type Server struct {
	id       string
	dbs      map[string]*database
	names    []string // of dbs, sorted
	locate   func(ctx context.Context, sku string) (string, error)
	log      *slog.Logger
	metrics  *metrics
	batchMax int
	staleAge time.Duration
	// parkAfter and idleMax are writerParkAfter and writerIdleMax; shorter
	// in tests. idleMax is read under mu.
	parkAfter, idleMax time.Duration
	// groupDelay is Config.GroupDelay, read by each database's committer.
	groupDelay time.Duration

	mu      sync.Mutex
	owned   map[int32]int64 // partition -> epoch
	writers map[stock.ShardKey]*writer
	halted  map[stock.ShardKey]halt
	seeds   map[stock.ShardKey]shardSeed
}

// shardSeed is a shard's row as a sibling's batch read it (the SKU's first
// batch on this server reads every shard of the SKU), kept for the shard's
// writer when it starts: its first batch then needs no read of the row and
// can be speculative. A seed may be stale (another server owned the
// partition meanwhile, an operator changed the row); the speculative write
// compares the row, halt included, and a group that runs with its reads
// reads it (stock.BatchQuery.Seeded), so a stale seed costs an attempt,
// never a wrong write. A seed serves only a writer of the ownership it was
// read in (epoch): within it, only this server writes the row.
type shardSeed struct {
	counts stock.Counts
	sku    *stock.SKU
	epoch  int64
	at     time.Time
}

// Bounds of the seeds.
const (
	// seedsMax bounds the seeds kept; planting past it starts afresh.
	seedsMax = 1 << 16
	// seedTTL is how long a seed is used: about as long as a writer
	// lives idle.
	seedTTL = writerIdleMax
)

// plant keeps the rows a batch of sku read of its sibling shards as seeds,
// except for shards that have a writer (its copy is newer) or that this
// server does not own.
func (s *Server) plant(skuName string, sku *stock.SKU, rows []stock.ShardRow) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seeds)+len(rows) > seedsMax {
		s.seeds = nil
	}
	if s.seeds == nil {
		s.seeds = make(map[stock.ShardKey]shardSeed, len(rows))
	}
	for _, r := range rows {
		k := stock.ShardKey{SKU: skuName, Index: r.Index}
		epoch, owned := s.owned[k.Partition()]
		if _, halted := s.halted[k]; !owned || halted || s.writers[k] != nil {
			continue // a shard halted while the read was in flight is not seeded
		}
		s.seeds[k] = shardSeed{counts: r.Counts, sku: sku, epoch: epoch, at: now}
	}
}

// takeSeed returns k's seed for a writer at epoch, if it has a fresh one
// of that ownership, and forgets it; s.mu is held.
func (s *Server) takeSeed(k stock.ShardKey, epoch int64) (shardSeed, bool) {
	sd, ok := s.seeds[k]
	if ok {
		delete(s.seeds, k)
	}
	return sd, ok && sd.epoch == epoch && time.Since(sd.at) < seedTTL
}

// halt is why a shard was found halted, and when: the reason is on its
// row, and a writer reads it again after haltRecheckInterval, so that a
// shard an operator resumed serves again without a word to this server.
type halt struct {
	reason string
	at     time.Time
}

// New returns a Server that owns no partition yet.
func New(cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	stores, locate := cfg.DBs, cfg.Locate
	if stores == nil {
		stores = map[string]Store{stock.DefaultDatabase: cfg.DB}
		locate = func(context.Context, string) (string, error) { return stock.DefaultDatabase, nil }
	}
	s := &Server{
		id:         cfg.ServerID,
		dbs:        map[string]*database{},
		locate:     locate,
		log:        log.With("server", cfg.ServerID),
		batchMax:   batchSizeMax,
		parkAfter:  writerParkAfter,
		idleMax:    writerIdleMax,
		groupDelay: min(max(cfg.GroupDelay, 0), GroupDelayMax),
		owned:      map[int32]int64{},
		writers:    map[stock.ShardKey]*writer{},
		halted:     map[stock.ShardKey]halt{},
	}
	for name, st := range stores {
		d := &database{name: name, store: st, fenced: map[int32]int64{}}
		d.committer = newCommitter(s, d)
		s.dbs[name] = d
		s.names = append(s.names, name)
	}
	slices.Sort(s.names)
	s.metrics = newMetrics(cfg.Registerer, s.lostCommits, s.speculated)
	s.staleAge = transferStaleAge
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.gauges()...)
		cfg.Registerer.MustRegister(stockCollector{s})
	}
	return s
}

// gauges are the server's state for /metrics, read at each scrape.
func (s *Server) gauges() []prometheus.Collector {
	read := func(f func() int) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return float64(f())
		}
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardstock_shard_partitions_owned", Help: "Partitions this shard server owns (writes) now."},
			read(func() int { return len(s.owned) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardstock_shard_writers", Help: "Shard writers: one per shard touched in about the last minute (each runs a goroutine only while it has work)."},
			read(func() int { return len(s.writers) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardstock_shard_queue_depth", Help: "Requests waiting in the shard writers' queues, all shards."},
			read(func() int {
				n := 0
				for _, w := range s.writers {
					n += w.queue.Len()
				}
				return n
			})),
	}
}

// ID is the server's id.
func (s *Server) ID() string { return s.id }

// Acquire takes partition over at epoch: it bumps the fence in every
// database (waiting for the previous owner's batches in flight), then starts
// serving the partition's shards, each loaded afresh. A database that does
// not answer is fenced later, by the first writer that needs it (bind); if
// none answers, Acquire fails.
func (s *Server) Acquire(ctx context.Context, partition int32, epoch int64) error {
	s.Lose(partition) // an older ownership's writers must not survive
	errs := make([]error, len(s.names))
	var wg sync.WaitGroup
	for i, name := range s.names {
		d := s.dbs[name]
		wg.Go(func() { errs[i] = s.takeOver(ctx, d, partition, epoch) })
	}
	wg.Wait()
	if failed := len(slices.DeleteFunc(slices.Clone(errs), func(e error) bool { return e == nil })); failed == len(errs) {
		return errors.Join(errs...)
	} else if failed > 0 {
		s.log.Warn("partition taken over in some databases only; the rest on first use", "partition", partition, "err", errors.Join(errs...))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.owned[partition] = epoch
	for k := range s.halted {
		if k.Partition() == partition {
			delete(s.halted, k)
		}
	}
	s.log.Debug("acquired partition", "partition", partition, "epoch", epoch)
	return nil
}

// takeOver bumps partition's fence to epoch in d and notes it there.
func (s *Server) takeOver(ctx context.Context, d *database, partition int32, epoch int64) error {
	if err := d.store.TakeOver(ctx, partition, s.id, epoch); err != nil {
		return fmt.Errorf("database %q: %w", d.name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d.fenced[partition] = epoch
	return nil
}

// fencedIn reports whether partition is taken over at epoch in d.
func (s *Server) fencedIn(d *database, partition int32, epoch int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return d.fenced[partition] == epoch
}

// speculated sums every database's speculative groups: committed, then
// fallen back.
func (s *Server) speculated() (committed, fellBack int64) {
	for _, d := range s.dbs {
		c, f := d.store.Speculated()
		committed, fellBack = committed+c, fellBack+f
	}
	return committed, fellBack
}

// lostCommits sums every database's lost commits.
func (s *Server) lostCommits() stock.LostCommits {
	var out stock.LostCommits
	for _, d := range s.dbs {
		l := d.store.LostCommits()
		out.Committed += l.Committed
		out.Voided += l.Voided
		out.Unknown += l.Unknown
	}
	return out
}

// Lose stops all writes to partition at once: its writers finish the batch
// in flight (which the fence still lets commit, since nobody took over yet)
// and answer the rest SHARD_UNAVAILABLE.
func (s *Server) Lose(partition int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseLocked(partition)
}

func (s *Server) loseLocked(partition int32) {
	delete(s.owned, partition)
	for _, d := range s.dbs {
		delete(d.fenced, partition)
	}
	for k, w := range s.writers {
		if k.Partition() == partition {
			delete(s.writers, k)
			close(w.stop)
		}
	}
}

// Owned returns the partitions the server owns, with their epochs.
func (s *Server) Owned() map[int32]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int32]int64, len(s.owned))
	for p, e := range s.owned {
		out[p] = e
	}
	return out
}

// Do applies one request through its shard's writer and waits for the
// result or ctx. A request whose ctx ends first may still be applied: the
// caller retries with the same key, which is safe.
func (s *Server) Do(ctx context.Context, r *stock.Request) stock.Result {
	return s.DoAll(ctx, []*stock.Request{r})[0]
}

// enqueue hands r to its shard's writer, starting one if needed.
func (s *Server) enqueue(r *stock.Request) (*pending, stock.Result) {
	key := r.Shard
	s.mu.Lock()
	defer s.mu.Unlock()
	epoch, ok := s.owned[key.Partition()]
	if !ok {
		return nil, unavailable("shard server " + s.id + " does not own this shard")
	}
	if h, ok := s.halted[key]; ok {
		if time.Since(h.at) < haltRecheckInterval {
			return nil, haltedResult(key)
		}
		delete(s.halted, key) // the next writer reads the row, and its halt, again
	}
	w := s.writers[key]
	if w == nil {
		w = newWriter(s, key, epoch)
		if sd, ok := s.takeSeed(key, epoch); ok {
			w.seed(sd)
		}
		s.writers[key] = w
	}
	p := &pending{req: r, done: make(chan stock.Result, 1)}
	if !w.queue.Push(p) {
		s.metrics.rejected.Inc()
		return nil, unavailable("shard queue is full")
	}
	if !w.running {
		w.running = true
		go w.run()
	}
	return p, stock.Result{}
}

// remove forgets w if it is still the shard's writer.
func (s *Server) remove(w *writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writers[w.key] == w {
		delete(s.writers, w.key)
	}
}

// park ends an idle writer's goroutine (true) unless a request arrived
// meanwhile: the writer keeps its row, and the next request starts a
// goroutine again (enqueue, under the same lock). A writer with requests
// queued goes on, stopped or not: its loop answers them or drains them.
func (s *Server) park(w *writer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.queue.Len() > 0 {
		return false
	}
	w.running = false
	w.goroutines.Add(-1)
	return true
}

// dropIdle forgets the parked writers that ran no batch for idleMax, and
// their rows: the next request for such a shard starts a new writer,
// which reads its row. A suspect writer is kept: its row's check against
// the ledger is still to be made, and a new writer would not make it.
func (s *Server) dropIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	before := time.Now().Add(-s.idleMax)
	for k, w := range s.writers {
		if !w.running && !w.suspect && w.lastBatch.Before(before) {
			delete(s.writers, k)
		}
	}
}

// dropIdleEvery runs dropIdle every dropIdleInterval until ctx ends: on
// a goroutine of its own, so that a sweep waiting on its database does not
// hold it back.
func (s *Server) dropIdleEvery(ctx context.Context) {
	t := time.NewTicker(dropIdleInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.dropIdle()
		}
	}
}

// fenced: the database says another server owns w's partition at a newer
// epoch. Stop serving it here until topology hands it back.
func (s *Server) fenced(w *writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owned[w.fence.Partition] == w.fence.Epoch {
		s.loseLocked(w.fence.Partition)
	}
	// Only w's own entry: once this server took the partition back at a
	// new epoch, the key's entry may be the new epoch's writer, and
	// dropping it would start a second writer of the shard beside it
	// (each would see the other's writes as a divergence, and halt it).
	if s.writers[w.key] == w {
		delete(s.writers, w.key)
	}
}

// halt refuses further writes to w's shard, for reason. record: the halt is
// new, and is written on the shard's row (under the writer's fence), where
// it stays until an operator resumes the shard; a halt read from the row is
// not recorded again.
func (s *Server) halt(w *writer, reason string, record bool) {
	if record {
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		err := w.db.store.HaltShard(ctx, w.fence, w.key, reason)
		cancel()
		if err != nil {
			// Halted in memory regardless; the next writer finds the row
			// wrong again and records it then.
			s.log.Error("recording a shard's halt failed", "shard", w.key.String(), "err", err)
		}
		s.metrics.halted.Inc()
		s.metrics.divergences.WithLabelValues("halted").Inc()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.halted[w.key] = halt{reason: reason, at: time.Now()}
	s.metrics.haltedShards.WithLabelValues(w.key.SKU, strconv.Itoa(int(w.key.Index))).Set(1)
	if s.writers[w.key] == w {
		delete(s.writers, w.key)
	}
}

// running notes that a writer loaded k's row and found it not halted.
func (s *Server) running(k stock.ShardKey) {
	s.metrics.haltedShards.DeleteLabelValues(k.SKU, strconv.Itoa(int(k.Index)))
}

// Halted returns the shards this server refuses as halted, with why.
func (s *Server) Halted() map[stock.ShardKey]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[stock.ShardKey]string, len(s.halted))
	for k, h := range s.halted {
		out[k] = h.reason
	}
	return out
}

// Counts returns a shard's counts: from its writer's memory when it has one
// (shard servers answer sweeps from memory), else from the database.
func (s *Server) Counts(ctx context.Context, key stock.ShardKey) (stock.Counts, error) {
	s.mu.Lock()
	_, ok := s.owned[key.Partition()]
	w := s.writers[key]
	s.mu.Unlock()
	if !ok {
		return stock.Counts{}, stock.Errorf(stock.CodeShardUnavailable, "shard server %s does not own this shard", s.id)
	}
	if w != nil {
		if c := w.committed.Load(); c != nil {
			return *c, nil
		}
	}
	name, err := s.locate(ctx, key.SKU)
	if err != nil {
		return stock.Counts{}, err
	}
	d := s.dbs[name]
	if d == nil {
		return stock.Counts{}, unconfigured(name)
	}
	return d.store.LoadShard(ctx, key)
}

// unconfigured answers a SKU whose database this server has no URL for.
func unconfigured(name string) *stock.Error {
	return stock.Errorf(stock.CodeShardUnavailable, "database %q is not configured on this shard server", name)
}

// Run sweeps expired reservations of owned shards until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	prune := time.NewTicker(pruneInterval)
	defer prune.Stop()
	dropped := make(chan struct{})
	go func() { defer close(dropped); s.dropIdleEvery(ctx) }()
	defer func() { <-dropped }()
	for {
		select {
		case <-ctx.Done():
			s.stopAll()
			for _, d := range s.dbs {
				d.committer.close()
			}
			return nil
		case <-t.C:
			s.sweep(ctx)
		case <-prune.C:
			for _, name := range s.names {
				if _, err := s.dbs[name].store.PruneCommitMarks(ctx); err != nil {
					s.log.Warn("pruning commit marks", "database", name, "err", err)
				}
			}
		}
	}
}

// sweep hands an expiry request to every owned shard with due holds, in
// every database; the writer expires them in its next batch, serialised
// with commits and releases of the same shard. It also finishes transfers
// left half-way. A database that does not answer is skipped until the next
// sweep; the gauges count what the databases that answered listed.
func (s *Server) sweep(ctx context.Context) {
	owned := s.Owned()
	if len(owned) == 0 {
		return
	}
	parts := make([]int32, 0, len(owned))
	for p := range owned {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var due, stale int
	for _, name := range s.names {
		n, m := s.sweepDB(ctx, s.dbs[name], parts)
		due, stale = due+n, stale+m
	}
	s.metrics.dueShards.Set(float64(due))
	s.metrics.staleTransfers.Set(float64(stale))
}

// sweepDB sweeps the partitions parts of d and returns how many shards had
// due holds and how many transfers were stale.
func (s *Server) sweepDB(ctx context.Context, d *database, parts []int32) (due, stale int) {
	keys, err := d.store.DueShards(ctx, parts, sweepShardsMax)
	if err != nil {
		s.log.Warn("sweep: listing due shards", "database", d.name, "err", err)
	}
	for _, k := range keys {
		s.enqueue(&stock.Request{Kind: stock.OpExpire, Shard: k, Source: stock.SourceSweeper})
	}
	// Finish transfers left half-way (their mover died): debit pending ones
	// on their source, credit debited ones on their destination.
	steps, err := d.store.StaleTransfers(ctx, parts, s.staleAge, sweepShardsMax)
	if err != nil {
		s.log.Warn("sweep: listing stale transfers", "database", d.name, "err", err)
	}
	for _, st := range steps {
		s.enqueue(&stock.Request{Kind: st.Kind, Shard: st.Shard, TransferID: st.Transfer, Source: stock.SourceSweeper})
	}
	return len(keys), len(steps)
}

// stopAll stops every writer.
func (s *Server) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.owned {
		s.loseLocked(p)
	}
}

// DoAll applies many requests at once: each is validated, then all are
// queued to their writers before any is waited for, so that requests for one
// shard share a batch.
func (s *Server) DoAll(ctx context.Context, reqs []*stock.Request) []stock.Result {
	results := make([]stock.Result, len(reqs))
	waits := make([]*pending, len(reqs))
	for i, r := range reqs {
		if err := stock.ValidateRequest(r); err != nil {
			results[i] = stock.ErrResult(err, stock.Errorf(stock.CodeInternal, "invalid request"))
			continue
		}
		if r.Source == "" {
			r.Source = stock.SourceAPI
		}
		waits[i], results[i] = s.enqueue(r)
	}
	for i, p := range waits {
		if p == nil {
			continue
		}
		select {
		case results[i] = <-p.done:
		case <-ctx.Done():
			results[i] = stock.Result{Err: stock.Errorf(stock.CodeShardUnavailable, "deadline passed before the shard answered; retry with the same key or look the key up")}
		}
	}
	return results
}
