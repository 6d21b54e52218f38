package loadgentest

import (
	"context"
	"sync"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/stock"
)

var _ loadgen.OrderTarget = (*Memory)(nil)

// memOrders are Memory's orders. mu serialises every order call, so that
// an order's lines are taken and ended as one step (the lines themselves go
// through take and end, under Memory's own lock).
type memOrders struct {
	mu      sync.Mutex
	byKey   map[string]*memOrder
	byID    map[string]*memOrder
	refunds map[string]int64 // refund key -> units
	commits int64            // CommitOrder calls that ended an order, for HalfCommitEvery
}

type memOrder struct {
	order loadgen.Order
	asked []loadgen.Line // the lines as asked, to tell a reused key
}

func (o *memOrders) init() {
	if o.byKey == nil {
		o.byKey, o.byID, o.refunds = map[string]*memOrder{}, map[string]*memOrder{}, map[string]int64{}
	}
}

// ReserveOrder holds every line (each a reserve under the key "KEY|SKU") or,
// when one is refused, releases those held and fails the order.
func (m *Memory) ReserveOrder(ctx context.Context, key string, lines []loadgen.Line) (loadgen.Order, loadgen.Outcome) {
	m.orders.mu.Lock()
	defer m.orders.mu.Unlock()
	m.orders.init()
	if o, ok := m.orders.byKey[key]; ok {
		switch {
		case !sameLines(o.asked, lines):
			return loadgen.Order{}, loadgen.Error(string(stock.CodeIdempotencyKeyReused))
		case o.order.State == loadgen.OrderFailed:
			return loadgen.Order{}, loadgen.OutOfStock
		}
		return o.order, loadgen.Replayed
	}
	o := &memOrder{order: loadgen.Order{ID: newID(), State: loadgen.OrderHeld}, asked: lines}
	var refused loadgen.Outcome
	for _, l := range lines {
		id, out := m.take(ctx, "reserve", l.SKU, key+"|"+l.SKU, l.Qty)
		if out.Status != loadgen.StatusOK && out.Status != loadgen.StatusReplayed {
			refused = out
			break
		}
		o.order.Lines = append(o.order.Lines, loadgen.Line{SKU: l.SKU, Qty: l.Qty, ReservationID: id})
	}
	if refused.Status != 0 {
		for _, l := range o.order.Lines {
			m.end(context.WithoutCancel(ctx), l.ReservationID, "released")
		}
		if refused.Status != loadgen.StatusOutOfStock {
			// Not a refusal for stock: no order, as if never sent.
			return loadgen.Order{}, refused
		}
		o.order.State = loadgen.OrderFailed
	}
	m.orders.byKey[key], m.orders.byID[o.order.ID] = o, o
	if refused.Status != 0 {
		return loadgen.Order{}, refused
	}
	return o.order, loadgen.OK
}

func sameLines(a, b []loadgen.Line) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].SKU != b[i].SKU || a[i].Qty != b[i].Qty {
			return false
		}
	}
	return true
}

// CommitOrder commits every line of a held order (HalfCommitEvery: all but
// the last).
func (m *Memory) CommitOrder(ctx context.Context, id string) loadgen.Outcome {
	m.orders.mu.Lock()
	defer m.orders.mu.Unlock()
	m.orders.init()
	o, ok := m.orders.byID[id]
	switch {
	case !ok:
		return loadgen.Error(string(stock.CodeOrderNotFound))
	case o.order.State == loadgen.OrderCommitted:
		return loadgen.Replayed
	case o.order.State != loadgen.OrderHeld:
		return loadgen.Error(string(stock.CodeInvalidArgument))
	}
	m.orders.commits++
	lines := o.order.Lines
	if m.HalfCommitEvery > 0 && m.orders.commits%m.HalfCommitEvery == 0 {
		lines = lines[:len(lines)-1]
	}
	for _, l := range lines {
		m.end(context.WithoutCancel(ctx), l.ReservationID, "committed")
	}
	o.order.State = loadgen.OrderCommitted
	return loadgen.OK
}

// Refund gives back qty units of a committed reservation, at most what it
// sold in all (RefundTwice: twice over, uncapped).
func (m *Memory) Refund(ctx context.Context, sku, key, reservationID string, qty int64) loadgen.Outcome {
	m.orders.mu.Lock()
	defer m.orders.mu.Unlock()
	m.orders.init()
	if n, ok := m.orders.refunds[key]; ok {
		if n != qty {
			return loadgen.Error(string(stock.CodeIdempotencyKeyReused))
		}
		return loadgen.Replayed
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.reservations[reservationID]
	if !ok || r.sku != sku || r.state != "committed" {
		return loadgen.Error(string(stock.CodeSaleNotFound))
	}
	orig := loadgen.SaleOfReservation(reservationID)
	var done int64
	for _, e := range m.skus[sku].ledger {
		if e.kind == "refund" && e.original == orig {
			done -= e.dSold
		}
	}
	times := 1
	if m.RefundTwice {
		times = 2
	} else if done+qty > r.qty {
		return loadgen.Error(string(stock.CodeRefundExceedsSale))
	}
	s := m.skus[sku]
	for range times {
		s.sold -= qty
		s.available += qty
		s.ledger = append(s.ledger, memEntry{kind: "refund", key: key, original: orig, dAvail: qty, dSold: -qty})
	}
	m.orders.refunds[key] = qty
	return loadgen.OK
}

// GetOrder reads the order of an idempotency key.
func (m *Memory) GetOrder(ctx context.Context, key string) (loadgen.Order, bool, error) {
	m.orders.mu.Lock()
	defer m.orders.mu.Unlock()
	m.orders.init()
	o, ok := m.orders.byKey[key]
	if !ok {
		return loadgen.Order{}, false, nil
	}
	return o.order, true, nil
}
