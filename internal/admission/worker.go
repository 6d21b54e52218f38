package admission

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of the admission worker.
const (
	// PollInterval is how often the worker looks at each SKU with waiting
	// tickets: units that come back (a release, an expiry, a replenish)
	// reach the oldest ticket they fit within about this much, well within
	// the second the design promises. A look is two queries (the SKU's
	// counts and its first tickets), only for SKUs with tickets open.
	PollInterval = 100 * time.Millisecond
	// IdleListInterval is how often a worker whose last look found no
	// open ticket anywhere lists the tickets again. A ticket entered
	// through this process wakes it at once (Service.opened), and a SKU's
	// lease is free while no ticket of it is open, so the process that
	// enters a SKU's first ticket takes the SKU at once; this interval
	// only bounds how late an idle worker finds tickets that another
	// process entered and left (it stopped before its worker looked):
	// far within pendingStale, after which a PENDING ticket is taken
	// over. Polling at PollInterval while nothing is open was the largest
	// part of an idle allocator's work (docs/bench-log/2026-12-05-modelc2.md).
	IdleListInterval = time.Second
	// pendingStale is how old a PENDING ticket must be before the worker
	// takes it over: its request's process died, or gave up, between
	// entering it and answering. A live request answers in well under
	// this (a reserve is bounded by the allocator's deadlines).
	pendingStale = 10 * time.Second
	// admitBatchLen bounds the tickets one pass reads: more than the units
	// that come back between two passes in any sale we know of; those
	// beyond wait for the next pass.
	admitBatchLen = 500
	// skusPerPassMax bounds the SKUs one worker looks at per interval.
	skusPerPassMax = 1000
	// passTimeout bounds one SKU's pass.
	passTimeout = 5 * time.Second
	// admitParallelMax bounds the admissions a pass has in flight. Each
	// is a reserve, which queues for the shard's writer (one transaction
	// for what queued), and a mark, which queues for the marks' batch
	// (one statement): so many take no more connections than a few, and
	// a crowd's returned units reach their tickets in a few round trips.
	admitParallelMax = 32
)

// Lease is a SKU's admission lease, held (topology.MoveLease).
type Lease interface {
	Lost() <-chan struct{}
	Release(ctx context.Context) error
}

// Leases takes a SKU's admission lease: nil and no error while another
// process holds it.
type Leases func(ctx context.Context, sku string) (Lease, error)

// Worker admits waiting tickets as units come back, for every SKU whose
// lease it takes. It learns of returned units by polling the SKU's
// available count (docs/admission.md says why not the change stream).
type Worker struct {
	svc      *Service
	leases   Leases
	interval time.Duration
	// IdleInterval is IdleListInterval unless a test sets it before Run.
	IdleInterval time.Duration
	log          *slog.Logger
	held         map[string]Lease
	// drawn remembers the SKUs whose draw this worker saw ranked, so
	// that a pass of a drawn SKU costs no draw query.
	drawn map[string]bool
	// listFailing: the last listing of the waitlists failed (and was said).
	listFailing bool
}

// NewWorker returns a worker of svc; interval 0 is PollInterval.
func NewWorker(svc *Service, leases Leases, interval time.Duration, log *slog.Logger) *Worker {
	if interval == 0 {
		interval = PollInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &Worker{svc: svc, leases: leases, interval: interval, IdleInterval: max(interval, IdleListInterval), log: log,
		held: map[string]Lease{}, drawn: map[string]bool{}}
}

// Run works until ctx ends, then gives its leases back. It looks every
// interval while some ticket is open, else every IdleInterval or as soon
// as this process enters a ticket.
func (w *Worker) Run(ctx context.Context) {
	defer w.releaseAll()
	timer := time.NewTimer(w.interval)
	defer timer.Stop()
	idle := false
	for {
		var opened <-chan struct{}
		if idle {
			opened = w.svc.opened
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-opened:
		}
		idle = !w.round(ctx)
		if idle {
			timer.Reset(w.IdleInterval)
		} else {
			timer.Reset(w.interval)
		}
	}
}

// round makes one pass over every SKU with open tickets whose lease this
// worker holds or takes, and gives back the leases of SKUs with none. It
// reports whether it found a ticket open (or could not tell).
func (w *Worker) round(ctx context.Context) bool {
	skus, err := w.svc.store.OpenTicketSKUs(ctx, skusPerPassMax)
	if err != nil {
		// Said once a streak: a database down for a minute would
		// otherwise write a line each interval.
		if ctx.Err() == nil && !w.listFailing {
			w.log.Warn("admission: list the waitlists (said once until it works again)", "err", err)
		}
		w.listFailing = true
		return true
	}
	if w.listFailing {
		w.log.Info("admission: the waitlists are listed again")
		w.listFailing = false
	}
	open := make(map[string]bool, len(skus))
	for _, sku := range skus {
		open[sku] = true
		if !w.hold(ctx, sku) {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, passTimeout)
		if err := w.pass(pctx, sku, w.held[sku]); err != nil && ctx.Err() == nil {
			w.log.Warn("admission: pass", "sku", sku, "err", err)
		}
		cancel()
	}
	for sku, l := range w.held {
		if !open[sku] {
			_ = l.Release(ctx)
			delete(w.held, sku)
			delete(w.drawn, sku)
		}
	}
	return len(skus) > 0
}

// hold reports whether this worker holds sku's lease, taking it if free.
func (w *Worker) hold(ctx context.Context, sku string) bool {
	if l, ok := w.held[sku]; ok {
		select {
		case <-l.Lost():
			delete(w.held, sku)
		default:
			return true
		}
	}
	l, err := w.leases(ctx, sku)
	if err != nil || l == nil {
		return false
	}
	w.held[sku] = l
	return true
}

func (w *Worker) releaseAll() {
	for sku, l := range w.held {
		_ = l.Release(context.Background())
		delete(w.held, sku)
	}
}

// pass runs sku's draw once its registration has closed (draw.go), then
// admits sku's first tickets that the units available now fit, in order
// (drawn order after a draw, else of arrival), while the lease holds; once the SKU is sold out for
// good it answers every waiting ticket SOLD_OUT.
func (w *Worker) pass(ctx context.Context, sku string, l Lease) error {
	s := w.svc
	s.metrics.passes.Inc()
	cfg, err := s.seller.SKU(ctx, sku)
	if err != nil {
		return err
	}
	if cfg.Admission.Mode == stock.AdmissionDraw && !w.drawn[sku] {
		// Registrations hold nothing until the draw ranks them; then they
		// are the waitlist, in drawn order, admitted below like any.
		ranked, err := s.runDraw(ctx, cfg)
		if err != nil || !ranked {
			return err
		}
		w.drawn[sku] = true
	}
	// The units in flight (requests' PENDING tickets) are read before the
	// stock, and are not free for the waitlist: a reserve in flight is then
	// counted in them, or has taken its units from those read, or both,
	// never neither. Read after, a unit promised to a request could be
	// claimed for a ticket too; the request's reserve would fail, and its
	// ticket wait behind younger ones admitted in its place.
	tickets, inFlight, err := s.store.OpenTickets(ctx, sku, pendingStale, admitBatchLen)
	if err != nil {
		return err
	}
	free, gone, err := s.seller.Availability(ctx, sku)
	if err != nil {
		return err
	}
	free -= inFlight
	if gone {
		n, err := s.store.SoldOutWaiting(ctx, sku, pendingStale)
		s.metrics.soldOut.Add(float64(n))
		return err
	}
	// Claimed before any reserve, the oldest that the units free fit, in
	// one statement: if this worker stops between a claim and its mark,
	// the next finishes the admission whatever is free then, for the
	// reserve may hold the units already. A ticket cancelled meanwhile is
	// not claimed; its units wait for the next pass.
	var batch, fit []*stock.Ticket
	var ids []string
	for _, t := range tickets {
		switch {
		case t.State != stock.TicketWaiting:
			// A pending ticket (claimed, or its request's process gone)
			// is admitted whatever is free: its reserve, the same key, is
			// a replay if it was applied.
			batch = append(batch, t)
		case t.Quantity <= free:
			fit, ids, free = append(fit, t), append(ids, t.ID), free-t.Quantity
		}
		// else: the oldest ticket they fit may come later
	}
	if len(ids) > 0 {
		claimed, err := s.store.ClaimTickets(ctx, ids)
		if err != nil {
			return err
		}
		ok := make(map[string]bool, len(claimed))
		for _, id := range claimed {
			ok[id] = true
		}
		for _, t := range fit {
			if ok[t.ID] {
				t.State = stock.TicketPending
				batch = append(batch, t)
			}
		}
	}
	// The reserves and marks of a batch run admitParallelMax at a time:
	// one after another, the units of a crowd's expiries would reach their
	// tickets a round trip each. The claims fixed which tickets they go to.
	sem := make(chan struct{}, admitParallelMax)
	var wg sync.WaitGroup
	for _, t := range batch {
		select {
		case <-l.Lost():
			wg.Wait()
			return nil // another worker finishes the claimed ones: a reserve it repeats is a replay
		case sem <- struct{}{}:
		}
		wg.Go(func() {
			defer func() { <-sem }()
			_, res := s.admit(ctx, t, cfg, "", false)
			switch {
			case res.Err == nil:
			case res.Err.Code == stock.CodeOutOfStock:
				// Taken meanwhile: back in its place in the waitlist.
				if _, err := s.store.WaitTicket(ctx, t.ID, cfg.Admission.WaitlistMax); err != nil {
					w.log.Warn("admission: put back", "sku", sku, "ticket", t.ID, "err", err)
				}
			default:
				// Unknown outcome: the ticket stays claimed, and the next
				// pass tries it again with the same key.
				w.log.Warn("admission: admit", "sku", sku, "ticket", t.ID, "err", res.Err)
			}
		})
	}
	wg.Wait()
	return nil
}
