package rebalance

import (
	"context"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/failpoint"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// Bounds of moving stock.
const (
	// movesInFlightMax bounds the transfers of one plan running at once.
	movesInFlightMax = 4
	// planTimeout bounds one plan's moves; a transfer cut off half-way is
	// completed by the next mover or the shard servers' sweep.
	planTimeout = 15 * time.Second
)

// moveHold is the right to move one SKU's stock: its move lease, with the
// SKU's move fence raised to the lease's token.
type moveHold struct {
	sku     string
	token   int64
	lost    <-chan struct{}
	release func()
}

// gone reports whether the lease may have been lost.
func (h *moveHold) gone() bool {
	select {
	case <-h.lost:
		return true
	default:
		return false
	}
}

// hold takes sku's move lease (waiting for it while another holder has
// it when wait is set; else REBALANCE_IN_PROGRESS) and raises the SKU's
// move fence to its token, so that no older holder's transfer starts from
// then on. Without move leases (an allocator built without etcd, in tests)
// the token is 0, which only a SKU never moved under a lease accepts.
func (r *Rebalancer) hold(ctx context.Context, sku string, wait bool) (*moveHold, error) {
	if r.moves == nil {
		return &moveHold{sku: sku, lost: make(chan struct{}), release: func() {}}, nil
	}
	var l *topology.MoveLease
	var err error
	if wait {
		l, err = r.moves.Acquire(ctx, sku)
	} else {
		l, err = r.moves.TryAcquire(ctx, sku)
	}
	if err != nil {
		return nil, err
	}
	r.metrics.leasesHeld.Inc()
	release := func() {
		r.metrics.leasesHeld.Dec()
		if err := l.Release(context.Background()); err != nil {
			r.log.Warn("could not release a move lease; it ends with the process's etcd lease", "sku", sku, "err", err)
		}
	}
	if err := r.db.RaiseMoveFence(ctx, sku, l.Token, l.Holder); err != nil {
		release()
		return nil, err
	}
	return &moveHold{sku: sku, token: l.Token, lost: l.Lost(), release: release}, nil
}

// runMoves carries out moves under h, at most movesInFlightMax at once, and
// returns each transfer as it ended.
func (r *Rebalancer) runMoves(ctx context.Context, h *moveHold, moves []Move, policy Policy, source string) []*stock.Transfer {
	out := make([]*stock.Transfer, len(moves))
	sem := make(chan struct{}, movesInFlightMax)
	var wg sync.WaitGroup
	for i, m := range moves {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], _ = r.transfer(ctx, h, m, policy, source)
		}()
	}
	wg.Wait()
	r.metrics.plans.WithLabelValues(string(policy)).Inc()
	return out
}

// transfer runs one move to its end: create the transfer with h's token,
// debit its source through the source's writer, credit its destination
// through the destination's. A move cut off after the debit is completed by
// the next mover or the shard servers' sweep; the units count as in transit
// meanwhile. It returns the transfer as far as it got. Its failpoints
// (the end-to-end tests kill the allocator there): "before-create" (the
// move lease held and its fence raised, nothing written), "created" (the
// transfer pending), "debited" (the units in transit), "credited" (the
// destination credited, the lease still held).
func (r *Rebalancer) transfer(ctx context.Context, h *moveHold, m Move, policy Policy, source string) (*stock.Transfer, error) {
	t := &stock.Transfer{ID: stock.NewTransferID(), SKU: h.sku, From: m.From, To: m.To, Quantity: m.Quantity,
		FenceToken: h.token, Reason: string(policy)}
	if h.gone() {
		r.metrics.transfersEnded.WithLabelValues("lease_lost").Inc()
		return t, stock.Errorf(stock.CodeMoveFenced, "the move lease of %s was lost", h.sku)
	}
	failpoint.Pause("before-create")
	if err := r.db.CreateTransfer(ctx, t); err != nil {
		r.metrics.transfersEnded.WithLabelValues(reasonOf(err)).Inc()
		return t, err
	}
	t.State = stock.TransferPending
	r.metrics.transfersStarted.WithLabelValues(string(policy)).Inc()
	failpoint.Pause("created")
	out := r.exec(ctx, &stock.Request{Kind: stock.OpTransferOut, Shard: stock.ShardKey{SKU: h.sku, Index: m.From}, TransferID: t.ID, Source: source})
	if out.Err != nil {
		if out.Err.Code == stock.CodeOutOfStock || out.Err.Code == stock.CodeMoveFenced {
			t.State = stock.TransferAborted
		}
		r.metrics.transfersEnded.WithLabelValues(string(out.Err.Code)).Inc()
		return t, out.Err
	}
	t.State = stock.TransferDebited
	r.metrics.inTransit.Add(float64(m.Quantity))
	failpoint.Pause("debited")
	in := r.exec(ctx, &stock.Request{Kind: stock.OpTransferIn, Shard: stock.ShardKey{SKU: h.sku, Index: m.To}, TransferID: t.ID, Source: source})
	r.metrics.inTransit.Sub(float64(m.Quantity))
	if in.Err != nil {
		r.metrics.transfersEnded.WithLabelValues(string(in.Err.Code)).Inc()
		return t, in.Err
	}
	t.State = stock.TransferCredited
	r.metrics.transfersEnded.WithLabelValues("credited").Inc()
	r.metrics.unitsMoved.Add(float64(m.Quantity))
	failpoint.Pause("credited")
	return t, nil
}

// reasonOf labels an error for a metric: its domain code (INTERNAL for
// one without).
func reasonOf(err error) string { return string(stock.CodeOf(err)) }
