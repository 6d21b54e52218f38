package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/shardstock/shardstock/internal/failpoint"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of orders. A driver holds a lease on the order it works on and
// renews it before each line; a line's call is bounded well inside it, so
// that a recovery that takes the order over after the lease ran out finds
// no line of the old driver still on its way (docs/orders.md says what
// remains: a call lost in the network, as for any request in doubt).
const (
	// orderLeaseTTL is a driver's lease on an order.
	orderLeaseTTL = 4 * time.Second
	// orderLineTimeout bounds one line's call (take, extend, commit, release).
	orderLineTimeout = 2 * time.Second
	// orderRecoverInterval is how often an allocator looks for open orders
	// whose driver's lease ran out.
	orderRecoverInterval = 500 * time.Millisecond
	// orderRecoverMax bounds the orders one pass takes over.
	orderRecoverMax = 16
	// orderCommitHold is how long every line is extended for before the
	// first is committed, so that none expires while the others commit.
	orderCommitHold = 30 * time.Second
	// orderAwaitMax bounds how long a call waits for an order another
	// call (or a recovery) is working on before it answers
	// OPERATION_IN_PROGRESS: a live driver ends it sooner, a dead one's
	// recovery within OrderRecoveryBound.
	orderAwaitMax = OrderRecoveryBound
	// orderAwaitPoll is how often a waiting call reads the order again.
	orderAwaitPoll = 100 * time.Millisecond
	// orderEndAttemptsMax bounds the tries of a line's commit or release
	// that answers SHARD_UNAVAILABLE before the order is left to recovery.
	orderEndAttemptsMax = 5
	// OrderRecoveryBound is the longest a line of an order whose driver
	// died stays held before a recovery releases it (or finishes the
	// order): the lease, a pass, and the lines' calls.
	OrderRecoveryBound = orderLeaseTTL + orderRecoverInterval + 2*orderLineTimeout + time.Second
)

// OrderStore is the storage orders are kept in (the database named main).
type OrderStore interface {
	CreateOrder(ctx context.Context, o *stock.Order, driver string, lease time.Duration) (*stock.Order, bool, error)
	GetOrder(ctx context.Context, id, key string) (*stock.Order, error)
	SetOrder(ctx context.Context, o *stock.Order, from stock.OrderState, driver string, lease time.Duration, claim bool) (bool, error)
	ClaimOrders(ctx context.Context, driver string, lease time.Duration, limit int) ([]*stock.Order, error)
	// OrderOfLine names the order a recorded line's reservation is of.
	OrderOfLine(ctx context.Context, reservationID string) (string, error)
}

// errOrderLost: another driver (a recovery) took the order over.
var errOrderLost = stock.Errorf(stock.CodeOperationInProgress, "the order is being finished elsewhere; ask GetOrder again")

func (a *Allocator) orderStore() (OrderStore, error) {
	if a.orders == nil {
		return nil, stock.Errorf(stock.CodeUnimplemented, "orders are not configured")
	}
	return a.orders, nil
}

// errOrderDriving: the caller left (or its deadline passed) while its
// order's lines were being taken; the drive goes on.
var errOrderDriving = stock.Errorf(stock.CodeOperationInProgress, "the order is still being held; a retry with the same key answers its outcome")

// ReserveOrder holds every line of an order or none. The order is written
// first (pending, with this allocator's lease); then its lines are taken
// one by one in the order of their SKUs, each a reserve whose key is
// derived from the order; a line refused releases every line taken, and the
// order fails with the line's refusal, naming its SKU. A retry with the
// same key returns the order as it is (replayed), once no call is working
// on it: it waits for the order's drive (at most orderAwaitMax).
//
// The drive does not end with the caller's request: a caller that leaves
// midway (a cancelled or timed-out request) gets its answer, the order's
// one outcome, from a retry with the same key, as for a single Reserve
// whose answer was lost. Undoing the lines when the caller left, as the
// drive once did, left the order pending for recovery, and every retry
// meanwhile could only be told OPERATION_IN_PROGRESS, then that the order
// failed.
func (a *Allocator) ReserveOrder(ctx context.Context, o *stock.Order) (*stock.Order, bool, error) {
	store, err := a.orderStore()
	if err != nil {
		return nil, false, err
	}
	if err := stock.PrepareOrder(o); err != nil {
		return nil, false, err
	}
	o.ID, o.State = stock.NewOrderID(), stock.OrderPending
	drv := a.newDriver()
	got, created, err := store.CreateOrder(ctx, o, drv, orderLeaseTTL)
	if err != nil {
		return nil, false, err
	}
	if !created {
		return a.answerOrder(a.awaitOrder(ctx, store, got), true)
	}
	// Each step of the drive is bounded on its own (orderLineTimeout, the
	// store's query timeout), so that the drive ends without the caller.
	left := *got // the caller's answer if it leaves: not the order the drive writes to
	left.Lines = slices.Clone(got.Lines)
	done := make(chan *stock.Order, 1)
	a.drives.Add(1)
	go func() {
		defer a.drives.Done()
		done <- a.holdLines(context.WithoutCancel(ctx), store, got, drv)
	}()
	select {
	case held := <-done:
		return a.answerOrder(held, false)
	case <-ctx.Done():
		return &left, false, errOrderDriving
	}
}

// awaitOrder returns o once no call works on it (it is not open), reading
// it again every orderAwaitPoll, at most orderAwaitMax or until ctx ends;
// then as it is. A live driver finishes it; a dead one's order is
// finished by a recovery within OrderRecoveryBound.
func (a *Allocator) awaitOrder(ctx context.Context, store OrderStore, o *stock.Order) *stock.Order {
	deadline := time.Now().Add(orderAwaitMax)
	for o.State.Open() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return o
		case <-time.After(orderAwaitPoll):
		}
		got, err := store.GetOrder(ctx, o.ID, "")
		if err != nil {
			return o
		}
		o = got
	}
	return o
}

// answerOrder is the answer for an order as it is: a failed order's
// refusal, an open one in progress. A failed order's end is definite even
// when its cause's code is not (SHARD_UNAVAILABLE when a recovery failed
// it): that code would tell the client to send the same key again, which
// only answers the same; ORDER_FAILED says nothing is held and a new
// attempt needs a new key.
func (a *Allocator) answerOrder(o *stock.Order, replayed bool) (*stock.Order, bool, error) {
	switch {
	case o.State == stock.OrderFailed:
		e := &stock.Error{Code: o.FailCode, Message: o.Reason, Metadata: map[string]string{"sku": o.FailSKU, "order_id": o.ID}}
		if !e.Code.Definite() {
			e.Metadata["cause"] = string(e.Code)
			e.Code = stock.CodeOrderFailed
		}
		return o, replayed, e
	case o.State.Open():
		return o, replayed, errOrderLost
	}
	return o, replayed, nil
}

// holdLines takes an order's lines, or undoes them, and returns the order
// as it ends here.
func (a *Allocator) holdLines(ctx context.Context, store OrderStore, o *stock.Order, drv string) *stock.Order {
	for i := range o.Lines {
		l := &o.Lines[i]
		if a.orderHook != nil {
			a.orderHook(o, i)
		}
		failpoint.Stop("order-line-" + strconv.Itoa(i)) // after i lines are held
		// The lease is renewed just before each line: once a recovery took
		// the order over, this driver takes no more.
		if ok, err := store.SetOrder(ctx, o, stock.OrderPending, drv, orderLeaseTTL, false); err != nil || !ok {
			a.undoLines(context.WithoutCancel(ctx), o)
			return a.reread(ctx, store, o)
		}
		res := a.takeLine(ctx, o, l)
		for try := 0; try < orderEndAttemptsMax && res.Err != nil && res.Err.Code == stock.CodeShardUnavailable; try++ {
			// Whether a shard applied it is not known, and a copy of it
			// may still land: send it again until the answer is definite
			// (the same key applies once; a refusal is one the allocator
			// settled with every shard that might apply it).
			res = a.takeLine(context.WithoutCancel(ctx), o, l)
		}
		if res.Err != nil && res.Err.Code == stock.CodeShardUnavailable {
			// Still not known: leave the order pending; its lease runs out
			// and a recovery undoes it.
			return a.reread(ctx, store, o)
		}
		if res.Err != nil {
			a.undoLines(context.WithoutCancel(ctx), o)
			o.State, o.FailCode, o.FailSKU = stock.OrderFailed, res.Err.Code, l.SKU
			o.Reason = fmt.Sprintf("line %s: %s", l.SKU, res.Err.Message)
			return a.settle(ctx, store, o, stock.OrderPending, drv)
		}
		l.ReservationID = res.Reservation.ID
		if o.ExpiresAt.IsZero() || res.Reservation.ExpiresAt.Before(o.ExpiresAt) {
			o.ExpiresAt = res.Reservation.ExpiresAt
		}
	}
	o.State = stock.OrderHeld
	return a.settle(ctx, store, o, stock.OrderPending, drv)
}

// newDriver names one drive of an order: this allocator and a fresh
// token, so that a recovery here never shares a name with a call here
// still at work (each guard on the order's row names its own drive).
func (a *Allocator) newDriver() string { return a.driverID + "/" + stock.NewTransferID()[3:15] }

// takeLine holds one line: a reserve with the line's derived key, sent
// again (the same key: it applies once) while it answers SHARD_UNAVAILABLE,
// at most orderEndAttemptsMax times, all within orderLineTimeout.
func (a *Allocator) takeLine(ctx context.Context, o *stock.Order, l *stock.OrderLine) stock.Result {
	lctx, cancel := context.WithTimeout(ctx, orderLineTimeout)
	defer cancel()
	var res stock.Result
	for range orderEndAttemptsMax {
		res = a.Allocate(lctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: l.SKU}, Quantity: l.Quantity,
			Key: stock.OrderLineKey(o.ID, l.SKU), OrderRef: o.OrderRef, CustomerRef: o.CustomerRef, TTL: o.TTL, Source: stock.SourceOrder,
			Caller: o.Caller})
		if res.Err == nil || res.Err.Code != stock.CodeShardUnavailable || lctx.Err() != nil {
			return res
		}
	}
	return res
}

// settle records o's new state if this driver still drives it; else the
// order is what its new driver made it.
func (a *Allocator) settle(ctx context.Context, store OrderStore, o *stock.Order, from stock.OrderState, drv string) *stock.Order {
	ok, err := store.SetOrder(context.WithoutCancel(ctx), o, from, drv, orderLeaseTTL, false)
	if err == nil && ok {
		return o
	}
	return a.reread(ctx, store, o)
}

func (a *Allocator) reread(ctx context.Context, store OrderStore, o *stock.Order) *stock.Order {
	got, err := store.GetOrder(context.WithoutCancel(ctx), o.ID, "")
	if err != nil {
		c := *o
		c.State = stock.OrderPending // not known: in progress
		return &c
	}
	return got
}

// undoLines releases every line of o that is held: those it knows, and
// any other whose derived key a shard recorded (a call whose answer was
// lost). Each release is idempotent by reservation id.
func (a *Allocator) undoLines(ctx context.Context, o *stock.Order) {
	for _, l := range o.Lines {
		id := l.ReservationID
		if id == "" {
			op, err := a.db.GetOperation(ctx, l.SKU, stock.OrderLineKey(o.ID, l.SKU))
			if err != nil || op.ReservationState != stock.ReservationHeld {
				continue
			}
			id = op.ReservationID
		}
		a.endLine(ctx, o, stock.OpRelease, id, "order not held whole")
	}
}

// endLine commits, releases or extends one line of o, retrying while its
// shard is unavailable; it returns the last answer. The ledger names o's
// caller, whoever ends the line (a recovery included).
func (a *Allocator) endLine(ctx context.Context, o *stock.Order, kind stock.OpKind, id, reason string) stock.Result {
	var res stock.Result
	for range orderEndAttemptsMax {
		lctx, cancel := context.WithTimeout(ctx, orderLineTimeout)
		r := &stock.Request{Kind: kind, ReservationID: id, Reason: reason, Source: stock.SourceOrder, Caller: o.Caller}
		if kind == stock.OpExtend {
			r.TTL = orderCommitHold
		}
		res = a.EndReservation(lctx, r)
		cancel()
		if res.Err == nil || res.Err.Code != stock.CodeShardUnavailable {
			return res
		}
	}
	return res
}

// CommitOrder buys every line of a held order. Every line is first
// extended by orderCommitHold, so that none expires while the others
// commit; a line that expired already releases the others, and the order
// ends released (RESERVATION_EXPIRED).
func (a *Allocator) CommitOrder(ctx context.Context, id string) (*stock.Order, bool, error) {
	return a.endOrder(ctx, id, stock.OrderCommitting, "")
}

// ReleaseOrder gives every line of a held order back.
func (a *Allocator) ReleaseOrder(ctx context.Context, id, reason string) (*stock.Order, bool, error) {
	if err := stock.ValidateText("reason", reason, stock.ReasonLenMax); err != nil {
		return nil, false, err
	}
	return a.endOrder(ctx, id, stock.OrderReleasing, reason)
}

// endedOrders are the refusals of ending an order that ended otherwise.
var endedOrders = map[stock.OrderState]stock.Code{
	stock.OrderCommitted: stock.CodeReservationAlreadyCommitted,
	stock.OrderReleased:  stock.CodeReservationAlreadyReleased,
	stock.OrderFailed:    stock.CodeReservationNotFound,
}

func (a *Allocator) endOrder(ctx context.Context, id string, to stock.OrderState, reason string) (*stock.Order, bool, error) {
	store, err := a.orderStore()
	if err != nil {
		return nil, false, err
	}
	if id == "" || len(id) > stock.IdempotencyKeyLenMax {
		return nil, false, stock.Errorf(stock.CodeInvalidArgument, "order_id is empty or too long")
	}
	o, err := store.GetOrder(ctx, id, "")
	if err != nil {
		return nil, false, err
	}
	o = a.awaitOrder(ctx, store, o) // another call (or a recovery) works on it: its outcome
	done := map[stock.OrderState]stock.OrderState{stock.OrderCommitting: stock.OrderCommitted, stock.OrderReleasing: stock.OrderReleased}[to]
	switch {
	case o.State == done || o.State == to:
		if o.State == to {
			return o, true, errOrderLost
		}
		return o, true, nil
	case o.State != stock.OrderHeld:
		if code, ok := endedOrders[o.State]; ok {
			return o, false, stock.Errorf(code, "the order is %s", o.State)
		}
		return o, false, errOrderLost
	}
	o.State, o.Reason = to, reason
	drv := a.newDriver()
	if ok, err := store.SetOrder(ctx, o, stock.OrderHeld, drv, orderLeaseTTL, true); err != nil || !ok {
		return a.endOrder(ctx, id, to, reason) // another call took it: answer as it goes
	}
	o, err = a.finishOrder(ctx, store, o, drv)
	if err != nil {
		return o, false, err
	}
	if o.State == stock.OrderReleased && to == stock.OrderCommitting {
		return o, false, stock.Errorf(stock.CodeReservationExpired, "the order expired: %s", o.Reason)
	}
	return o, false, nil
}

// finishOrder carries a committing or releasing order to its end: the
// driver's call, or a recovery's.
func (a *Allocator) finishOrder(ctx context.Context, store OrderStore, o *stock.Order, drv string) (*stock.Order, error) {
	ctx = context.WithoutCancel(ctx)
	from := o.State
	if from == stock.OrderCommitting {
		for _, l := range o.Lines {
			res := a.endLine(ctx, o, stock.OpExtend, l.ReservationID, "")
			switch {
			case res.Err == nil:
			case res.Err.Code == stock.CodeReservationAlreadyCommitted:
				// a recovery (or this call before) committed it already
			case res.Err.Code == stock.CodeShardUnavailable:
				return o, res.Err // left committing: a retry or a recovery goes on
			default:
				// Expired (or otherwise ended): the order cannot be bought
				// whole. Nothing is committed yet unless every line was
				// extended, so release what is held.
				o.State, o.Reason = stock.OrderReleasing, "line "+l.SKU+": "+res.Err.Message
				if ok, err := store.SetOrder(ctx, o, from, drv, orderLeaseTTL, false); err != nil || !ok {
					return a.reread(ctx, store, o), errOrderLost
				}
				from = stock.OrderReleasing
			}
			if from == stock.OrderReleasing {
				break
			}
		}
	}
	kind, end := stock.OpCommit, stock.OrderCommitted
	if from == stock.OrderReleasing {
		kind, end = stock.OpRelease, stock.OrderReleased
	}
	for _, l := range o.Lines {
		res := a.endLine(ctx, o, kind, l.ReservationID, o.Reason)
		if res.Err != nil && res.Err.Code == stock.CodeShardUnavailable {
			return o, res.Err
		}
		if res.Err != nil && kind == stock.OpCommit && res.Err.Code != stock.CodeReservationAlreadyCommitted {
			// Cannot happen after every line was extended, unless the
			// order stalled past orderCommitHold: say so loudly.
			a.log.Error("INVARIANT order line not committed", "order", o.ID, "sku", l.SKU, "err", res.Err)
			return o, stock.Errorf(stock.CodeInternal, "order %s: line %s could not be committed", o.ID, l.SKU)
		}
	}
	o.State = end
	return a.settle(ctx, store, o, from, drv), nil
}

// GetOrder reads an order by id or by its idempotency key.
func (a *Allocator) GetOrder(ctx context.Context, id, key string) (*stock.Order, error) {
	store, err := a.orderStore()
	if err != nil {
		return nil, err
	}
	switch {
	case (id == "") == (key == ""):
		return nil, stock.Errorf(stock.CodeInvalidArgument, "give order_id or idempotency_key")
	case key != "":
		if err := stock.ValidateKey(key); err != nil {
			return nil, err
		}
	case len(id) > stock.IdempotencyKeyLenMax:
		return nil, stock.Errorf(stock.CodeOrderNotFound, "no such order")
	}
	return store.GetOrder(ctx, id, key)
}

// recoverOrders finishes or undoes, every orderRecoverInterval, the open
// orders whose driver's lease ran out (it died, or stalled): a pending
// order's lines are released and it fails; a committing or releasing one
// is carried to its end.
func (a *Allocator) recoverOrders() {
	t := time.NewTicker(orderRecoverInterval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), orderLeaseTTL)
		drv := a.newDriver()
		os, err := a.orders.ClaimOrders(ctx, drv, orderLeaseTTL, orderRecoverMax)
		if err != nil && !errors.Is(err, context.Canceled) {
			a.log.Warn("order recovery: claim", "err", err)
		}
		for _, o := range os {
			a.recoverOrder(ctx, o, drv)
		}
		cancel()
	}
}

func (a *Allocator) recoverOrder(ctx context.Context, o *stock.Order, drv string) {
	a.metrics.ordersRecovered.WithLabelValues(string(o.State)).Inc()
	if o.State != stock.OrderPending {
		if _, err := a.finishOrder(ctx, a.orders, o, drv); err != nil {
			a.log.Warn("order recovery: finish", "order", o.ID, "err", err)
		}
		return
	}
	a.undoLines(ctx, o)
	o.State, o.FailCode, o.Reason = stock.OrderFailed, stock.CodeShardUnavailable, "its driver stopped before every line was held; none is"
	a.settle(ctx, a.orders, o, stock.OrderPending, drv)
}
