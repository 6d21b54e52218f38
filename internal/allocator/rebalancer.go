package allocator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
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

// RebalanceConfig configures an allocator's rebalancer.
type RebalanceConfig struct {
	// Off turns the background refill and tail plans off for every SKU.
	// Retired shards are still drained; SetShards, Rebalance and the
	// per-request consolidation still move stock.
	Off bool
	// Interval is the time between rounds; 0 means rebalanceInterval.
	Interval time.Duration
	// Thresholds of the policies; zero means rebalance.DefaultThresholds.
	Thresholds rebalance.Thresholds
	// Auto configures the automatic split and merge; zero means
	// DefaultAutoShards (with its Off as given).
	Auto AutoShards
	// RetireGrace is how long after a SKU's last layout change its shards
	// out of service may retire; 0 means retireGrace. It must exceed the
	// longest a shard batch runs.
	RetireGrace time.Duration
}

func (c *RebalanceConfig) fill() {
	if c.Interval == 0 {
		c.Interval = rebalanceInterval
	}
	if c.RetireGrace == 0 {
		c.RetireGrace = retireGrace
	}
	if c.Thresholds == (rebalance.Thresholds{}) {
		c.Thresholds = rebalance.DefaultThresholds
	}
	if c.Auto.SplitRatePerShard == 0 {
		off := c.Auto.Off
		c.Auto = DefaultAutoShards
		c.Auto.Off = off
	}
}

// rebalancer is the allocator's background mover: every round it plans
// the SKUs with the most demand here and those with shards being retired.
type rebalancer struct {
	a   *Allocator
	cfg RebalanceConfig

	mu    sync.Mutex
	split map[string]*autoSplit // SKUs this allocator split, by name
}

// autoSplit is what the automatic split remembers of a SKU it split.
type autoSplit struct {
	base    int32     // shards before the first split
	lastHot time.Time // last round with demand
}

// run does rounds until ctx ends.
func (r *rebalancer) run(ctx context.Context) {
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
func (r *rebalancer) round(ctx context.Context) {
	a := r.a
	hot := a.demand.round(leasesHeldMax)
	var retiring []string
	if names, err := a.db.RetiringSKUs(ctx, retiringSKUsMax); err != nil {
		a.log.Warn("rebalancer: could not list the SKUs being retired", "err", err)
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
			if _, _, err := a.plan(ctx, h.sku, h.recent, false, false); err != nil && stock.CodeOf(err) != stock.CodeRebalanceInProgress {
				a.log.Debug("rebalancer: plan failed", "sku", h.sku, "err", err)
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
func (r *rebalancer) retire(ctx context.Context, name string) {
	a := r.a
	if _, _, err := a.plan(ctx, name, a.demand.recentOf(name), true, false); err != nil && stock.CodeOf(err) != stock.CodeRebalanceInProgress {
		a.log.Debug("rebalancer: drain failed", "sku", name, "err", err)
	}
	done, err := a.db.FinishRetirement(ctx, name, r.cfg.RetireGrace)
	switch {
	case err != nil:
		a.log.Warn("rebalancer: could not retire shards", "sku", name, "err", err)
	case done:
		a.forgetSKU(name)
		a.metrics.retirements.Inc()
		a.log.Info("rebalancer: shards retired", "sku", name)
	}
}

// auto splits a SKU whose demand per shard has stayed above the split rate;
// it reports whether it did.
func (r *rebalancer) auto(ctx context.Context, h skuRound) bool {
	c := r.cfg.Auto
	if c.Off {
		return false
	}
	a := r.a
	sku, err := a.sku(ctx, h.sku)
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
	if _, err := a.SetShards(ctx, h.sku, to); err != nil {
		a.log.Warn("rebalancer: automatic split failed", "sku", h.sku, "to", to, "err", err)
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
	a.metrics.reshards.WithLabelValues("split", "auto").Inc()
	a.log.Info("rebalancer: automatic split", "sku", h.sku, "from", sku.Shards, "to", to, "units_per_shard_per_s", int64(perShard))
	return true
}

// merge halves, toward the shards it had, each SKU this allocator split
// that has had no demand here for MergeAfter.
func (r *rebalancer) merge(ctx context.Context, hot []skuRound) {
	if r.cfg.Auto.Off {
		return
	}
	a := r.a
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
		sku, err := a.sku(ctx, name)
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
		if _, err := a.SetShards(ctx, name, to); err != nil {
			a.log.Warn("rebalancer: automatic merge failed", "sku", name, "to", to, "err", err)
			continue
		}
		a.metrics.reshards.WithLabelValues("merge", "auto").Inc()
		a.log.Info("rebalancer: automatic merge", "sku", name, "from", sku.Shards, "to", to)
	}
}

// plan decides a SKU's moves from its shards as committed and the demand
// this allocator saw (recent, by shard), and carries them out under the
// SKU's move lease: it looks first without the lease, and takes it only if
// there is something to move. force skips the refill's trigger; dryRun
// returns the moves (state planned) and moves nothing. A SKU another
// holder moves is REBALANCE_IN_PROGRESS.
func (a *Allocator) plan(ctx context.Context, sku string, recent []int64, force, dryRun bool) (rebalance.Policy, []*stock.Transfer, error) {
	policy, moves, err := a.decide(ctx, sku, recent, force)
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
	h, err := a.holdSKU(ctx, sku, false)
	if err != nil {
		return policy, nil, err
	}
	defer h.release()
	// Decide again under the lease: the last holder may have moved it.
	if policy, moves, err = a.decide(ctx, sku, recent, force); err != nil || len(moves) == 0 {
		return policy, nil, err
	}
	return policy, a.runMoves(ctx, h, moves, policy, stock.SourceRebalancer), nil
}

// decide reads a SKU's shards and returns what its policies ask for.
func (a *Allocator) decide(ctx context.Context, sku string, recent []int64, force bool) (rebalance.Policy, []rebalance.Move, error) {
	rows, err := a.db.Shards(ctx, sku)
	if err != nil {
		return "", nil, err
	}
	shards := make([]rebalance.Shard, len(rows))
	for i, r := range rows {
		shards[i] = rebalance.Shard{Index: r.Index, Available: r.Available, Retiring: r.Retiring}
		if int(r.Index) < len(recent) && !r.Retiring {
			shards[i].Demand = recent[r.Index]
		}
		if r.HaltReason != "" {
			// A halted shard takes no transfer: neither a source nor a
			// destination (a credit it refused would strand the units in
			// transit until it is resumed).
			shards[i].Available, shards[i].Retiring, shards[i].Demand = 0, true, 0
		}
	}
	policy, moves := rebalance.Decide(shards, a.rebalanceCfg.Thresholds, force)
	return policy, moves, nil
}

// Rebalance runs one plan for a SKU now, under its move lease, and returns
// its transfers as they ended; with dryRun it returns the plan's moves
// (state planned) and moves nothing. It plans whatever the thresholds say
// (the refill's trigger is skipped). Another allocator moving the SKU is
// REBALANCE_IN_PROGRESS.
func (a *Allocator) Rebalance(ctx context.Context, sku string, dryRun bool) ([]*stock.Transfer, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if _, err := a.db.GetSKU(ctx, sku); err != nil {
		return nil, err
	}
	_, ts, err := a.plan(ctx, sku, a.demand.recentOf(sku), true, dryRun)
	return ts, err
}

// SetShards changes the number of a SKU's shards in service (1..256),
// online. It returns once the new layout is in force for routing (the shard
// writers read it in every batch: no new reserve or deduct starts on a
// shard out of service once it commits); the moves that spread stock to new
// shards, or drain the ones being retired, go on in the background.
func (a *Allocator) SetShards(ctx context.Context, name string, shards int32) (*stock.Stock, error) {
	if err := stock.ValidateSKU(name); err != nil {
		return nil, err
	}
	if err := stock.ValidateShards(shards); err != nil {
		return nil, err
	}
	before, err := a.db.GetSKU(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := a.db.SetShards(ctx, name, shards); err != nil {
		return nil, err
	}
	a.forgetSKU(name)
	switch {
	case shards > before.Shards:
		a.metrics.reshards.WithLabelValues("split", "set").Inc()
	case shards < before.Shards:
		a.metrics.reshards.WithLabelValues("merge", "set").Inc()
	}
	a.log.Info("shards set", "sku", name, "from", before.Shards, "to", shards)
	a.settling.Add(1)
	go a.settle(name)
	return a.GetStock(ctx, name)
}

// settle runs plans for a SKU whose layout changed until it has nothing to
// move (at most settleRoundsMax), waiting for its move lease.
func (a *Allocator) settle(name string) {
	defer a.settling.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for range settleRoundsMax {
		wctx, wcancel := context.WithTimeout(ctx, settleWait)
		h, err := a.holdSKU(wctx, name, true)
		wcancel()
		if err != nil {
			a.log.Warn("could not spread the stock of a SKU whose shards changed; the rebalancer's rounds will", "sku", name, "err", err)
			return
		}
		policy, moves, err := a.decide(ctx, name, a.demand.recentOf(name), true)
		if err == nil && len(moves) > 0 {
			pctx, pcancel := context.WithTimeout(ctx, planTimeout)
			a.runMoves(pctx, h, moves, policy, stock.SourceRebalancer)
			pcancel()
		}
		h.release()
		if err != nil || len(moves) == 0 || errors.Is(ctx.Err(), context.Canceled) {
			return
		}
	}
}

// MoveLeases lists the move leases held now, by SKU.
func (a *Allocator) MoveLeases(ctx context.Context) ([]stock.MoveLease, error) {
	if a.moves == nil {
		return nil, nil
	}
	return a.moves.List(ctx)
}
