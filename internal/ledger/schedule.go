package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
)

// Store is what the ledger needs of storage (internal/postgres, or a set
// of databases): the SKUs, and a SKU's books read at one instant.
type Store interface {
	// SKUs returns up to limit SKU names above after, in order.
	SKUs(ctx context.Context, after string, limit int) ([]string, error)
	// Snapshot reads what Check needs of a SKU, from each shard's latest
	// checkpoint on.
	Snapshot(ctx context.Context, sku string) (Snapshot, error)
	// Stretches reads up to limit of a SKU's stretches that no walk has
	// checked, of its shards with none recorded unsound: each shard's
	// oldest first, in order, the shards taking turns.
	Stretches(ctx context.Context, sku string, limit int) ([]Stretch, error)
	// Walked records how far a walk got on one of a SKU's shards; a
	// shard's record never moves back.
	Walked(ctx context.Context, sku string, w Walk) error
}

// Lease is the right to run a pass of scheduled reconciliation, held by
// one allocator at a time (internal/topology.MoveLeases.TryReconcile).
type Lease interface {
	// Lost is closed once the lease may have expired.
	Lost() <-chan struct{}
	// Release gives the lease up.
	Release(ctx context.Context) error
}

const (
	// reconcileIntervalDefault is how often a pass starts: every SKU's
	// books are checked at least this often while some allocator runs.
	reconcileIntervalDefault = 10 * time.Minute
	// skusPageMax bounds the SKU names read at once.
	skusPageMax = 500
	// releaseTimeout bounds giving the lease back after a pass.
	releaseTimeout = 5 * time.Second
)

// ErrLeaseLost ends a pass whose lease may have expired: another
// allocator may be running one.
var ErrLeaseLost = errors.New("ledger: reconciliation lease lost")

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	Store Store
	// TryLease takes the lease of scheduled reconciliation; nil, nil when
	// another allocator holds it.
	TryLease func(ctx context.Context) (Lease, error)
	// Interval is the time between the starts of two attempts at a pass;
	// 0 is reconcileIntervalDefault.
	Interval time.Duration
	// WalkStretchesMax bounds the stretches a pass walks; 0 is
	// walkStretchesPerPassMax, negative walks none.
	WalkStretchesMax int
	Registerer       prometheus.Registerer
	Logger           *slog.Logger
}

// Scheduler reconciles every SKU on a schedule: at each interval, the
// allocator that takes the lease runs a pass over every SKU, each read
// from its shards' checkpoints on, and walks a bounded number of the
// stretches before them (walk.go). The metrics say what the last pass
// found and when one last succeeded, so that an unbalanced SKU is alerted
// on without anyone calling Reconcile.
type Scheduler struct {
	cfg     SchedulerConfig
	log     *slog.Logger
	metrics schedulerMetrics
	// walkFrom is the SKU where the last pass's walk ran out of stretches
	// to walk: the next walks from there, so that the first SKUs' long
	// ledgers do not hold the others back; "" after a walk that reached
	// the last SKU. Another allocator's passes keep their own: each walk
	// goes on from its Store's records, and only the order differs.
	walkFrom string
}

type schedulerMetrics struct {
	unbalanced  prometheus.Gauge
	lastSuccess prometheus.Gauge
	checked     prometheus.Gauge
	walked      prometheus.Gauge
	passes      *prometheus.CounterVec
}

// NewScheduler returns a Scheduler; Run starts it.
func NewScheduler(cfg SchedulerConfig) *Scheduler {
	if cfg.Interval <= 0 {
		cfg.Interval = reconcileIntervalDefault
	}
	if cfg.WalkStretchesMax == 0 {
		cfg.WalkStretchesMax = walkStretchesPerPassMax
	}
	s := &Scheduler{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	s.metrics = schedulerMetrics{
		unbalanced: gauge("shardstock_reconcile_unbalanced",
			"SKUs whose books the last scheduled reconciliation pass of this allocator found unbalanced (look at once: Reconcile lists the discrepancies)."),
		lastSuccess: gauge("shardstock_reconcile_last_success_timestamp_seconds",
			"When this allocator last finished a scheduled reconciliation pass over every SKU (Unix seconds; 0: never)."),
		checked: gauge("shardstock_reconcile_pass_skus", "SKUs checked by this allocator's last finished scheduled reconciliation pass."),
		walked: gauge("shardstock_reconcile_pass_stretches",
			"Stretches between two checkpoints walked by this allocator's last finished scheduled reconciliation pass (at most a bound per pass)."),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_reconcile_passes_total", Help: "Scheduled reconciliation passes by result: balanced, unbalanced, failed, or skipped (another allocator held the lease).",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.metrics.unbalanced, s.metrics.lastSuccess, s.metrics.checked, s.metrics.walked, s.metrics.passes)
	}
	return s
}

// Run attempts a pass at once and then at every interval, until ctx ends.
func (s *Scheduler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.attempt(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// attempt runs a pass if this allocator takes the lease.
func (s *Scheduler) attempt(ctx context.Context) {
	l, err := s.cfg.TryLease(ctx)
	if err != nil {
		s.log.Warn("ledger: take the reconciliation lease", "err", err)
		s.metrics.passes.WithLabelValues("failed").Inc()
		return
	}
	if l == nil {
		s.metrics.passes.WithLabelValues("skipped").Inc()
		return
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := l.Release(rctx); err != nil {
			s.log.Warn("ledger: release the reconciliation lease", "err", err)
		}
	}()
	p, err := s.Pass(ctx, l.Lost())
	if err != nil {
		s.log.Error("ledger: scheduled reconciliation pass failed", "checked", p.Checked, "err", err)
		s.metrics.passes.WithLabelValues("failed").Inc()
		return
	}
	result := "balanced"
	if len(p.Unbalanced) > 0 {
		result = "unbalanced"
		s.log.Error("INVARIANT: scheduled reconciliation found unbalanced books", "skus", p.Unbalanced)
	}
	s.metrics.passes.WithLabelValues(result).Inc()
	s.metrics.unbalanced.Set(float64(len(p.Unbalanced)))
	s.metrics.checked.Set(float64(p.Checked))
	s.metrics.walked.Set(float64(p.Walked))
	s.metrics.lastSuccess.Set(float64(time.Now().Unix()))
}

// Pass is what one pass found.
type Pass struct {
	Checked    int      // SKUs checked
	Walked     int      // stretches walked
	Unbalanced []string // SKUs with a discrepancy
}

// Pass checks every SKU's books once, in name order, until lost is closed
// (ErrLeaseLost) or a read fails, and walks up to WalkStretchesMax
// stretches, from the SKU where the last pass's walk stopped.
func (s *Scheduler) Pass(ctx context.Context, lost <-chan struct{}) (Pass, error) {
	var p Pass
	budget := max(s.cfg.WalkStretchesMax, 0)
	for after := ""; ; {
		skus, err := s.cfg.Store.SKUs(ctx, after, skusPageMax)
		if err != nil {
			return p, fmt.Errorf("ledger: list skus after %q: %w", after, err)
		}
		for _, sku := range skus {
			select {
			case <-lost:
				return p, ErrLeaseLost
			default:
			}
			snap, err := s.cfg.Store.Snapshot(ctx, sku)
			if stock.CodeOf(err) == stock.CodeSKUNotFound {
				continue // gone since it was listed
			}
			if err != nil {
				return p, fmt.Errorf("ledger: snapshot of %s: %w", sku, err)
			}
			p.Checked++
			ds := Check(snap)
			if budget > 0 && sku >= s.walkFrom {
				n, found, err := s.walk(ctx, sku, budget)
				if stock.CodeOf(err) == stock.CodeSKUNotFound {
					continue // gone since it was read
				}
				if err != nil {
					return p, fmt.Errorf("ledger: walk %s: %w", sku, err)
				}
				p.Walked, budget, ds = p.Walked+n, budget-n, append(ds, found...)
				if budget == 0 {
					s.walkFrom = sku // it may have more
				}
			}
			if len(ds) > 0 {
				p.Unbalanced = append(p.Unbalanced, sku)
				s.log.Error("INVARIANT: books unbalanced", "sku", sku, "discrepancies", ds)
			}
		}
		if len(skus) < skusPageMax {
			if budget > 0 {
				s.walkFrom = ""
			}
			return p, nil
		}
		after = skus[len(skus)-1]
	}
}
