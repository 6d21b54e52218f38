package rebalance

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// Bounds and defaults of the rebalancer.
const (
	// rebalanceInterval is the time between the rebalancer's rounds.
	rebalanceInterval = time.Second
	// leasesHeldMax bounds the SKUs one allocator's rounds move at once
	// (and so the move leases they hold). SetShards, Rebalance and the
	// per-request consolidation take leases of their own, one per call.
	leasesHeldMax = 8
	// retiringSKUsMax bounds the SKUs with shards being retired that one
	// round drains.
	retiringSKUsMax = 64
	// retireGrace is how long after its last layout change a SKU's shards
	// out of service may retire: longer than any batch that read the old
	// layout can run (shard batchTimeout, 10 s), so that none commits a
	// reservation on a shard already retired.
	retireGrace = 15 * time.Second
	// settleRoundsMax bounds the plans SetShards runs in the background to
	// spread stock to new shards or drain retired ones; the rounds finish
	// what is left.
	settleRoundsMax = 8
	// settleWait bounds how long a SetShards's background plan waits for
	// the SKU's move lease.
	settleWait = 30 * time.Second
)

// AutoShards configures the automatic split and merge.
type AutoShards struct {
	// Off turns them off for every SKU.
	Off bool
	// SplitRatePerShard: a SKU asked for more units per shard in service
	// per second than this, for SplitAfter in a row, gets twice the shards.
	SplitRatePerShard int64
	SplitAfter        time.Duration
	// ShardsMax is the most shards an automatic split gives.
	ShardsMax int32
	// MergeAfter: a SKU this allocator split, with no demand for this long,
	// goes back halfway to the shards it had, each time.
	MergeAfter time.Duration
}

// DefaultAutoShards are the automatic split's thresholds.
var DefaultAutoShards = AutoShards{
	SplitRatePerShard: 2000,
	SplitAfter:        5 * time.Second,
	ShardsMax:         64,
	MergeAfter:        10 * time.Minute,
}

// Config configures a rebalancer: the settings an operator chooses.
type Config struct {
	// Off turns the background refill and tail plans off for every SKU.
	// Retired shards are still drained; SetShards, Rebalance and the
	// per-request consolidation still move stock.
	Off bool
	// Interval is the time between rounds; 0 means rebalanceInterval.
	Interval time.Duration
	// Thresholds of the policies; zero means DefaultThresholds.
	Thresholds Thresholds
	// Auto configures the automatic split and merge; zero means
	// DefaultAutoShards (with its Off as given).
	Auto AutoShards
	// RetireGrace is how long after a SKU's last layout change its shards
	// out of service may retire; 0 means retireGrace. It must exceed the
	// longest a shard batch runs.
	RetireGrace time.Duration
}

func (c *Config) fill() {
	if c.Interval == 0 {
		c.Interval = rebalanceInterval
	}
	if c.RetireGrace == 0 {
		c.RetireGrace = retireGrace
	}
	if c.Thresholds == (Thresholds{}) {
		c.Thresholds = DefaultThresholds
	}
	if c.Auto.SplitRatePerShard == 0 {
		off := c.Auto.Off
		c.Auto = DefaultAutoShards
		c.Auto.Off = off
	}
}

// Host is what the process the rebalancer runs in (an allocator) hands it:
// its storage, its way to a shard, its SKU cache and its leases. The
// rebalancer reaches nothing else of it.
type Host struct {
	// Store is the rebalancer's storage; nil runs no rounds, which read
	// it (an allocator without a database: tests of its memory alone).
	Store Store
	// Exec sends one request (a transfer's debit or credit) to its
	// shard's owner and returns the answer.
	Exec func(ctx context.Context, r *stock.Request) stock.Result
	// SKU reads a SKU's configuration as the host caches it; Forget drops
	// the cached copy once the rebalancer changed the SKU's layout.
	SKU    func(ctx context.Context, name string) (*stock.SKU, error)
	Forget func(name string)
	// Moves hands out the SKUs' move leases (etcd); nil moves stock under
	// token 0 (tests without etcd).
	Moves      *topology.MoveLeases
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Rebalancer decides and runs the moves of stock between a SKU's shards:
// every round it plans the SKUs with the most demand here and those with
// shards being retired, splits and merges SKUs by demand, and it carries
// out SetShards, Rebalance and the per-request consolidations.
type Rebalancer struct {
	db      Store
	exec    func(ctx context.Context, r *stock.Request) stock.Result
	sku     func(ctx context.Context, name string) (*stock.SKU, error)
	forget  func(name string)
	moves   *topology.MoveLeases
	log     *slog.Logger
	metrics *metrics
	cfg     Config

	demand demandBook

	mu    sync.Mutex
	split map[string]*autoSplit // SKUs this allocator split, by name

	ctx      context.Context // ends with Close: the rounds' and settles'
	cancel   context.CancelFunc
	settling sync.WaitGroup // SetShards's background plans
	done     chan struct{}  // closed when the rounds have returned
}

// autoSplit is what the automatic split remembers of a SKU it split.
type autoSplit struct {
	base    int32     // shards before the first split
	lastHot time.Time // last round with demand
}

// New returns a Rebalancer and starts its rounds (none without a
// Store); Close stops them.
func New(h Host, cfg Config) *Rebalancer {
	cfg.fill()
	log := h.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Rebalancer{db: h.Store, exec: h.Exec, sku: h.SKU, forget: h.Forget, moves: h.Moves, log: log,
		metrics: newMetrics(h.Registerer), cfg: cfg, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	if h.Store == nil {
		close(r.done)
		return r
	}
	go r.run(ctx)
	return r
}

// Close stops the rounds and waits for them and for SetShards's
// background plans. Call it once.
func (r *Rebalancer) Close() {
	r.cancel()
	<-r.done
	r.settling.Wait()
}

// AddDemand counts q units asked of shard first (the key's first choice)
// of sku: the demand the refill policy and the automatic split follow.
// It is on every request's path: a read lock and an atomic add.
func (r *Rebalancer) AddDemand(sku string, first int32, q int64) { r.demand.add(sku, first, q) }

// run does rounds until ctx ends.
func (r *Rebalancer) run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.round(ctx)
	}
}

// round plans the hot SKUs and drains the retiring ones, at most
// leasesHeldMax at once.
func (r *Rebalancer) round(ctx context.Context) {
	hot := r.demand.round(leasesHeldMax)
	var retiring []string
	if names, err := r.db.RetiringSKUs(ctx, retiringSKUsMax); err != nil {
		r.log.Warn("rebalancer: could not list the SKUs being retired", "err", err)
	} else {
		retiring = names
	}
	sem := make(chan struct{}, leasesHeldMax)
	var wg sync.WaitGroup
	do := func(f func()) {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f()
		}()
	}
	for _, h := range hot {
		do(func() {
			if r.auto(ctx, h) || r.cfg.Off {
				return
			}
			if _, _, err := r.plan(ctx, h.sku, h.recent, false, false); err != nil && stock.CodeOf(err) != stock.CodeRebalanceInProgress {
				r.log.Debug("rebalancer: plan failed", "sku", h.sku, "err", err)
			}
		})
	}
	for _, name := range retiring {
		do(func() { r.retire(ctx, name) })
	}
	wg.Wait()
	r.merge(ctx, hot)
}

// retire drains a SKU's shards being retired and retires them once they
// hold nothing.
func (r *Rebalancer) retire(ctx context.Context, name string) {
	if _, _, err := r.plan(ctx, name, r.demand.recentOf(name), true, false); err != nil && stock.CodeOf(err) != stock.CodeRebalanceInProgress {
		r.log.Debug("rebalancer: drain failed", "sku", name, "err", err)
	}
	done, err := r.db.FinishRetirement(ctx, name, r.cfg.RetireGrace)
	switch {
	case err != nil:
		r.log.Warn("rebalancer: could not retire shards", "sku", name, "err", err)
	case done:
		r.forget(name)
		r.metrics.retirements.Inc()
		r.log.Info("rebalancer: shards retired", "sku", name)
	}
}

// auto splits a SKU whose demand per shard has stayed above the split rate;
// it reports whether it did.
func (r *Rebalancer) auto(ctx context.Context, h skuRound) bool {
	c := r.cfg.Auto
	if c.Off {
		return false
	}
	sku, err := r.sku(ctx, h.sku)
	if err != nil || !sku.AutoShards || sku.Shards >= c.ShardsMax || sku.ShardSpan > sku.Shards {
		return false
	}
	perShard := float64(h.rate) / r.cfg.Interval.Seconds() / float64(sku.Shards)
	r.mu.Lock()
	if perShard <= float64(c.SplitRatePerShard) {
		h.d.hot = 0
	} else {
		h.d.hot++
	}
	ready := time.Duration(h.d.hot)*r.cfg.Interval >= c.SplitAfter
	if ready {
		h.d.hot = 0
	}
	r.mu.Unlock()
	if !ready {
		return false
	}
	to := min(sku.Shards*2, c.ShardsMax)
	if err := r.setShards(ctx, h.sku, to, "auto"); err != nil {
		r.log.Warn("rebalancer: automatic split failed", "sku", h.sku, "to", to, "err", err)
		return false
	}
	r.mu.Lock()
	if r.split == nil {
		r.split = map[string]*autoSplit{}
	}
	if r.split[h.sku] == nil {
		r.split[h.sku] = &autoSplit{base: sku.Shards}
	}
	r.split[h.sku].lastHot = time.Now()
	r.mu.Unlock()
	r.log.Info("rebalancer: automatic split", "sku", h.sku, "from", sku.Shards, "to", to, "units_per_shard_per_s", int64(perShard))
	return true
}

// merge halves, toward the shards it had, each SKU this allocator split
// that has had no demand here for MergeAfter.
func (r *Rebalancer) merge(ctx context.Context, hot []skuRound) {
	if r.cfg.Auto.Off {
		return
	}
	now := time.Now()
	r.mu.Lock()
	for _, h := range hot {
		if s := r.split[h.sku]; s != nil && h.rate > 0 {
			s.lastHot = now
		}
	}
	var due []string
	for name, s := range r.split {
		if now.Sub(s.lastHot) >= r.cfg.Auto.MergeAfter {
			due = append(due, name)
		}
	}
	r.mu.Unlock()
	for _, name := range due {
		sku, err := r.sku(ctx, name)
		if err != nil {
			continue
		}
		r.mu.Lock()
		s := r.split[name]
		if !sku.AutoShards {
			delete(r.split, name) // switched off: left as it is
			r.mu.Unlock()
			continue
		}
		to := max(sku.Shards/2, s.base)
		if to <= s.base {
			delete(r.split, name)
		} else {
			s.lastHot = now // the next halving waits MergeAfter again
		}
		r.mu.Unlock()
		if to >= sku.Shards {
			continue
		}
		if err := r.setShards(ctx, name, to, "auto"); err != nil {
			r.log.Warn("rebalancer: automatic merge failed", "sku", name, "to", to, "err", err)
			continue
		}
		r.log.Info("rebalancer: automatic merge", "sku", name, "from", sku.Shards, "to", to)
	}
}

// plan decides a SKU's moves from its shards as committed and the demand
// this allocator saw (recent, by shard), and carries them out under the
// SKU's move lease: it looks first without the lease, and takes it only if
// there is something to move. force skips the refill's trigger; dryRun
// returns the moves (state planned) and moves nothing. A SKU another
// holder moves is REBALANCE_IN_PROGRESS.
func (r *Rebalancer) plan(ctx context.Context, sku string, recent []int64, force, dryRun bool) (Policy, []*stock.Transfer, error) {
	policy, moves, err := r.decide(ctx, sku, recent, force)
	if err != nil || len(moves) == 0 {
		return policy, nil, err
	}
	if dryRun {
		out := make([]*stock.Transfer, len(moves))
		for i, m := range moves {
			out[i] = &stock.Transfer{SKU: sku, From: m.From, To: m.To, Quantity: m.Quantity, State: stock.TransferPlanned, Reason: string(policy)}
		}
		return policy, out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, planTimeout)
	defer cancel()
	h, err := r.hold(ctx, sku, false)
	if err != nil {
		return policy, nil, err
	}
	defer h.release()
	// Decide again under the lease: the last holder may have moved it.
	if policy, moves, err = r.decide(ctx, sku, recent, force); err != nil || len(moves) == 0 {
		return policy, nil, err
	}
	return policy, r.runMoves(ctx, h, moves, policy, stock.SourceRebalancer), nil
}

// decide reads a SKU's shards and returns what its policies ask for.
func (r *Rebalancer) decide(ctx context.Context, sku string, recent []int64, force bool) (Policy, []Move, error) {
	rows, err := r.db.Shards(ctx, sku)
	if err != nil {
		return "", nil, err
	}
	shards := make([]Shard, len(rows))
	for i, row := range rows {
		shards[i] = Shard{Index: row.Index, Available: row.Available, Retiring: row.Retiring}
		if int(row.Index) < len(recent) && !row.Retiring {
			shards[i].Demand = recent[row.Index]
		}
		if row.HaltReason != "" {
			// A halted shard takes no transfer: neither a source nor a
			// destination (a credit it refused would strand the units in
			// transit until it is resumed).
			shards[i].Available, shards[i].Retiring, shards[i].Demand = 0, true, 0
		}
	}
	policy, moves := Decide(shards, r.cfg.Thresholds, force)
	return policy, moves, nil
}

// Rebalance runs one plan for a SKU now, under its move lease, and returns
// its transfers as they ended; with dryRun it returns the plan's moves
// (state planned) and moves nothing. It plans whatever the thresholds say
// (the refill's trigger is skipped). Another allocator moving the SKU is
// REBALANCE_IN_PROGRESS.
func (r *Rebalancer) Rebalance(ctx context.Context, sku string, dryRun bool) ([]*stock.Transfer, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if _, err := r.db.GetSKU(ctx, sku); err != nil {
		return nil, err
	}
	_, ts, err := r.plan(ctx, sku, r.demand.recentOf(sku), true, dryRun)
	return ts, err
}

// SetShards changes the number of a SKU's shards in service (1..256),
// online. It returns once the new layout is in force for routing (the shard
// writers read it in every batch: no new reserve or deduct starts on a
// shard out of service once it commits); the moves that spread stock to new
// shards, or drain the ones being retired, go on in the background.
func (r *Rebalancer) SetShards(ctx context.Context, name string, shards int32) error {
	return r.setShards(ctx, name, shards, "set")
}

// setShards is SetShards, counted in shardstock_rebalancer_reshards_total
// as by's: "set" (SetShards) or "auto" (the automatic split and merge).
func (r *Rebalancer) setShards(ctx context.Context, name string, shards int32, by string) error {
	if err := stock.ValidateSKU(name); err != nil {
		return err
	}
	if err := stock.ValidateShards(shards); err != nil {
		return err
	}
	before, err := r.db.GetSKU(ctx, name)
	if err != nil {
		return err
	}
	if _, err := r.db.SetShards(ctx, name, shards); err != nil {
		return err
	}
	r.forget(name)
	switch {
	case shards > before.Shards:
		r.metrics.reshards.WithLabelValues("split", by).Inc()
	case shards < before.Shards:
		r.metrics.reshards.WithLabelValues("merge", by).Inc()
	}
	r.log.Info("shards set", "sku", name, "from", before.Shards, "to", shards)
	r.settling.Add(1)
	go r.settle(name)
	return nil
}

// settle runs plans for a SKU whose layout changed until it has nothing to
// move (at most settleRoundsMax), waiting for its move lease.
func (r *Rebalancer) settle(name string) {
	defer r.settling.Done()
	ctx := r.ctx
	for range settleRoundsMax {
		wctx, wcancel := context.WithTimeout(ctx, settleWait)
		h, err := r.hold(wctx, name, true)
		wcancel()
		if err != nil {
			r.log.Warn("could not spread the stock of a SKU whose shards changed; the rebalancer's rounds will", "sku", name, "err", err)
			return
		}
		policy, moves, err := r.decide(ctx, name, r.demand.recentOf(name), true)
		if err == nil && len(moves) > 0 {
			pctx, pcancel := context.WithTimeout(ctx, planTimeout)
			r.runMoves(pctx, h, moves, policy, stock.SourceRebalancer)
			pcancel()
		}
		h.release()
		if err != nil || len(moves) == 0 || errors.Is(ctx.Err(), context.Canceled) {
			return
		}
	}
}

// MoveLeases lists the move leases held now, by SKU.
func (r *Rebalancer) MoveLeases(ctx context.Context) ([]stock.MoveLease, error) {
	if r.moves == nil {
		return nil, nil
	}
	return r.moves.List(ctx)
}
