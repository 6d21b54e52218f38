package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// The cart model: checkout traffic over orders (issue 32). A client
// operation is one cart: ReserveOrder of its lines, all or nothing, then
// CommitOrder; CartRefundShare of the paid carts are payment failures, and
// each of their lines is refunded afterwards (Refund, the line's
// reservation as the sale), one refund per line.
const (
	CartLinesMin = 2
	CartLinesMax = 5
	// CartHotSKUs best sellers get cartHotShare of all lines, so that most
	// carts hold one of them and carts contend on their rows.
	CartHotSKUs  = 4
	cartHotShare = 0.5
	// CartRefundShare of the paid orders fail payment and are refunded.
	CartRefundShare = 0.1
	// orderLookupsParallelMax bounds the GetOrder calls of the final check
	// in flight at once.
	orderLookupsParallelMax = 8
	// orderSettleMax is how long the final check waits for orders still
	// open after the load (a driver stopped by an abandoned call leaves its
	// order to the system's recovery) to end: longer than shardstock's
	// bound on a line held by such an order (allocator.OrderRecoveryBound,
	// 9.5 s). An order open after it is counted unresolved.
	orderSettleMax  = 15 * time.Second
	orderSettlePoll = 250 * time.Millisecond
)

// OrderTarget is a Target that takes orders and refunds (shardstock). The
// cart model runs only on such a target; on any other, Run says it is not
// supported.
type OrderTarget interface {
	Target
	// ReserveOrder holds every line or none, under one idempotency key.
	// On success the answer's lines carry their reservation ids.
	ReserveOrder(ctx context.Context, key string, lines []Line) (Order, Outcome)
	// CommitOrder buys every line of a held order.
	CommitOrder(ctx context.Context, orderID string) Outcome
	// Refund gives back qty units of the sale of reservation id under its
	// own idempotency key.
	Refund(ctx context.Context, sku, key, reservationID string, qty int64) Outcome
	// GetOrder reads the order of an idempotency key; false when the system
	// has none.
	GetOrder(ctx context.Context, key string) (Order, bool, error)
}

// Line is one line of an order: a SKU, its units, and once held the
// reservation that holds them.
type Line struct {
	SKU           string
	Qty           int64
	ReservationID string
}

// Order is an order as the system answers it.
type Order struct {
	ID    string
	State OrderState
	Lines []Line
}

// OrderState is where an order ended.
type OrderState string

// Order states. OrderOpen is any state an order passes through (pending,
// committing, releasing): after a run, one is still being driven or
// recovered.
const (
	OrderHeld      OrderState = "held"
	OrderCommitted OrderState = "committed"
	OrderFailed    OrderState = "failed"
	OrderReleased  OrderState = "released"
	OrderOpen      OrderState = "open"
)

// SaleOfReservation names a reservation's sale as the system's refund
// records do (SKUState.Refunded).
func SaleOfReservation(id string) string { return "reservation:" + id }

// cartPick draws a line's SKU: cartHotShare of lines go to the first
// CartHotSKUs SKUs, the rest spread over the others.
func cartPick(n int32) func(r *rand.Rand) int32 {
	hot := min(CartHotSKUs, n)
	return func(r *rand.Rand) int32 {
		if r.Float64() < cartHotShare || hot == n {
			return r.Int32N(hot)
		}
		return hot + r.Int32N(n-hot)
	}
}

// cartFlow is one cart of a run.
type cartFlow struct {
	key      string
	skus     []int32 // distinct
	qty      []int64
	payFails bool
}

// cartAt draws the n-th cart: CartLinesMin to CartLinesMax distinct SKUs
// (a SKU drawn twice takes the next free one, so the draw is bounded),
// each of Config.Qty units.
func (ru *run) cartAt(n int64, r *rand.Rand) cartFlow {
	k := CartLinesMin + r.IntN(CartLinesMax-CartLinesMin+1)
	total := int32(len(ru.plan.skus))
	cf := cartFlow{key: fmt.Sprintf("%s-cart-%d", ru.cfg.RunID, n)}
	for len(cf.skus) < k {
		s := ru.plan.pick(r)
		for containsSKU(cf.skus, s) {
			s = (s + 1) % total
		}
		cf.skus = append(cf.skus, s)
		cf.qty = append(cf.qty, ru.cfg.Qty.draw(r))
	}
	cf.payFails = r.Float64() < CartRefundShare
	return cf
}

func containsSKU(skus []int32, s int32) bool {
	for _, x := range skus {
		if x == s {
			return true
		}
	}
	return false
}

// cartObs is what a client saw of one cart.
type cartObs struct {
	key     string
	lines   []Line // as asked, without reservation ids
	reserve sent
	held    Order // ReserveOrder's answer, when it held the cart
	commit  sent
	refunds []refundObs
}

// refundObs is what a client saw of one line's refund.
type refundObs struct {
	sku, reservationID string
	qty                int64
	s                  sent
}

// doCart runs one cart: hold it, buy it, and refund it if payment fails.
// Each call goes through send, with the run's faults and retries.
func (ru *run) doCart(ctx context.Context, w *worker, cf cartFlow) {
	ot := ru.target.(OrderTarget) // Run checked it
	obs := &cartObs{key: cf.key}
	var total int64
	for i, s := range cf.skus {
		obs.lines = append(obs.lines, Line{SKU: ru.plan.skus[s].SKU, Qty: cf.qty[i]})
		total += cf.qty[i]
	}
	w.t.carts = append(w.t.carts, obs)
	f := flow{sku: cf.skus[0], key: cf.key, qty: total}

	// A duplicate attempt may answer beside the first: keep the first
	// order that came back.
	var mu sync.Mutex
	obs.reserve = ru.send(ctx, w, opReserveOrder, f, func(ctx context.Context) (string, Outcome) {
		o, out := ot.ReserveOrder(ctx, cf.key, obs.lines)
		if out.Status != StatusOK && out.Status != StatusReplayed {
			return "", out
		}
		mu.Lock()
		if obs.held.ID == "" {
			obs.held = o
		}
		mu.Unlock()
		return o.ID, out
	})
	id := obs.reserve.id
	if id == "" {
		return
	}
	obs.commit = ru.send(ctx, w, opCommitOrder, f, func(ctx context.Context) (string, Outcome) {
		return "", ot.CommitOrder(ctx, id)
	})
	if !cf.payFails || applied(obs.commit.ok, obs.commit.replayed) == 0 {
		return
	}
	for i, l := range obs.held.Lines {
		key := fmt.Sprintf("%s-refund-%d", cf.key, i)
		s := ru.send(ctx, w, opRefund, f, func(ctx context.Context) (string, Outcome) {
			return "", ot.Refund(ctx, l.SKU, key, l.ReservationID, l.Qty)
		})
		obs.refunds = append(obs.refunds, refundObs{sku: l.SKU, reservationID: l.ReservationID, qty: l.Qty, s: s})
	}
}

// settleOrders reads the order of every cart's key, then reads the open
// ones again every orderSettlePoll until none is open or orderSettleMax
// passed. It runs before the final state is read, so that the state and
// the orders agree.
func settleOrders(ctx context.Context, ot OrderTarget, carts []*cartObs) (map[string]orderLookup, error) {
	got, err := lookupOrders(ctx, ot, carts)
	deadline := time.Now().Add(orderSettleMax)
	for err == nil {
		var open []*cartObs
		for _, c := range carts {
			if l := got[c.key]; l.found && l.order.State == OrderOpen {
				open = append(open, c)
			}
		}
		if len(open) == 0 || time.Now().After(deadline) || !Sleep(ctx, orderSettlePoll) {
			return got, nil
		}
		var again map[string]orderLookup
		again, err = lookupOrders(ctx, ot, open)
		for k, l := range again {
			got[k] = l
		}
	}
	return nil, err
}

// orderLookup is the system's answer for one cart's key.
type orderLookup struct {
	order Order
	found bool
}

// lookupOrders reads the order of every cart's key, orderLookupsParallelMax
// at a time.
func lookupOrders(ctx context.Context, ot OrderTarget, carts []*cartObs) (map[string]orderLookup, error) {
	out := make([]orderLookup, len(carts))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(orderLookupsParallelMax)
	for i, c := range carts {
		g.Go(func() error {
			o, found, err := ot.GetOrder(ctx, c.key)
			if err != nil {
				return fmt.Errorf("loadgen: GetOrder %s: %w", c.key, err)
			}
			out[i] = orderLookup{order: o, found: found}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	m := make(map[string]orderLookup, len(carts))
	for i, c := range carts {
		m[c.key] = out[i]
	}
	return m, nil
}

// CartStats counts what the cart model's clients saw.
type CartStats struct {
	// Orders counts carts sent; Held those ReserveOrder held, Refused those
	// it refused for certain; Committed those CommitOrder bought, and
	// Lines their lines.
	Orders, Held, Refused, Committed, Lines int64
	// Refunds counts lines refunded (acknowledged), of RefundedOrders
	// orders.
	Refunds, RefundedOrders int64
}

func cartStats(carts []*cartObs) *CartStats {
	var s CartStats
	for _, c := range carts {
		s.Orders++
		switch {
		case applied(c.reserve.ok, c.reserve.replayed) > 0:
			s.Held++
		case c.reserve.settled:
			s.Refused++
		}
		if applied(c.commit.ok, c.commit.replayed) > 0 {
			s.Committed++
			s.Lines += int64(len(c.held.Lines))
		}
		if len(c.refunds) > 0 {
			s.RefundedOrders++
		}
		for _, r := range c.refunds {
			if applied(r.s.ok, r.s.replayed) > 0 {
				s.Refunds++
			}
		}
	}
	return &s
}

// lineClass is where a line's reservation ended, by the system's ledger.
type lineClass uint8

const (
	lineNotHeld   lineClass = iota // never held, or released or expired
	lineHeld                       // held, no end
	lineCommitted                  // committed
)

func (k lineClass) String() string { return [...]string{"not held", "held", "committed"}[k] }

// classify reads where line l ended in st; ok is false when its
// reservation ended twice (counted as a duplicate by the caller).
func classify(st State, l Line) (k lineClass, ok bool) {
	if l.ReservationID == "" {
		return lineNotHeld, true
	}
	rec, held := st.SKUs[l.SKU].Reservations[l.ReservationID]
	switch {
	case !held:
		return lineNotHeld, true
	case rec.Ends() > 1:
		return lineNotHeld, false
	case rec.Committed == 1:
		return lineCommitted, true
	case rec.Ends() == 1:
		return lineNotHeld, true
	}
	return lineHeld, true
}

// assessCart computes the cart model's correctness line: every order held
// whole or not at all (HalfHeld), every refund within its sale
// (RefundBeyondSale), every acknowledged order, commit and refund in the
// system (Lost), no line held or ended twice (Duplicates), and the books of
// every SKU balanced (Reconciliation: the system's own reconciliation,
// conservation, and when every cart got a definite answer the units sold
// as the clients saw them).
func assessCart(skus []SKUSpec, carts []*cartObs, st State, orders map[string]orderLookup) Correctness {
	var c Correctness
	sale := map[string]int64{}      // committed lines' units, by sale
	ackRefund := map[string]int64{} // acknowledged refunded units, by sale
	clientSold := map[string]int64{}
	for _, o := range carts {
		assessOrder(&c, st, o, orders[o.key], sale, ackRefund, clientSold)
	}

	for _, spec := range skus {
		s, ok := st.SKUs[spec.SKU]
		if !ok {
			c.Reconciliation++
			c.detail("%s: missing from the final state", spec.SKU)
			continue
		}
		for _, orig := range sortedMapKeys(s.Refunded) {
			if over := s.Refunded[orig] - sale[orig]; over > 0 {
				c.RefundBeyondSale += over
				c.detail("%s: %s: refunded %d units of a sale of %d", spec.SKU, orig, s.Refunded[orig], sale[orig])
			}
		}
		for _, key := range sortedMapKeys(s.Keys) {
			if n := s.Keys[key].Applied; n > 1 {
				c.Duplicates += n - 1
				c.detail("%s: line key %s held %d times", spec.SKU, key, n)
			}
		}
		allowed := spec.Stock + s.Replenished
		if over := max(0, -s.Available, s.Sold+max(s.Reserved, 0)-allowed); over > 0 {
			c.Oversold += over
			c.detail("%s: oversold %d units: available %d, reserved %d, sold %d, of stock %d + replenished %d",
				spec.SKU, over, s.Available, s.Reserved, s.Sold, spec.Stock, s.Replenished)
		}
		for i, d := range s.Discrepancies {
			c.Reconciliation++
			if i < 3 {
				c.detail("%s: %s (shard %d): %s: expected %d, actual %d", spec.SKU, d.Check, d.Shard, d.Detail, d.Expected, d.Actual)
			}
		}
		if total := s.Available + s.Reserved + s.Sold + s.InTransit; total != allowed {
			c.Reconciliation++
			c.detail("%s: conservation: available %d + reserved %d + sold %d + in transit %d = %d, want %d",
				spec.SKU, s.Available, s.Reserved, s.Sold, s.InTransit, total, allowed)
		}
		if c.Unresolved == 0 && clientSold[spec.SKU] != s.Sold {
			c.Reconciliation++
			c.detail("%s: client against system: sold: clients saw %d (committed lines less refunds), the system has %d",
				spec.SKU, clientSold[spec.SKU], s.Sold)
		}
	}
	return c
}

// assessOrder checks one cart against the system's order and ledger, and
// adds its committed lines to sale, its acknowledged refunds to ackRefund
// and the units the client saw sold to clientSold.
func assessOrder(c *Correctness, st State, o *cartObs, got orderLookup, sale, ackRefund, clientSold map[string]int64) {
	reserved := applied(o.reserve.ok, o.reserve.replayed) > 0
	committed := applied(o.commit.ok, o.commit.replayed) > 0
	if !o.reserve.settled || (reserved && !o.commit.settled) {
		c.Unresolved++
	}
	if !got.found {
		if reserved {
			c.Lost++
			c.detail("order %s: acknowledged as held, not in the system", o.key)
		}
		return
	}
	if got.order.State == OrderOpen {
		c.Unresolved++
		c.detail("order %s: still open after the run", o.key)
		return
	}

	var counts [3]int
	for _, l := range got.order.Lines {
		k, ok := classify(st, l)
		if !ok {
			c.Duplicates++
			c.detail("order %s: line %s: reservation %s ended more than once", o.key, l.SKU, l.ReservationID)
		}
		counts[k]++
		if k == lineCommitted {
			sale[SaleOfReservation(l.ReservationID)] += l.Qty
		}
	}
	lines := len(got.order.Lines)
	switch {
	case counts[lineNotHeld] != lines && counts[lineHeld] != lines && counts[lineCommitted] != lines:
		c.HalfHeld++
		c.detail("order %s (%s): half held: %d lines not held, %d held, %d committed",
			o.key, got.order.State, counts[lineNotHeld], counts[lineHeld], counts[lineCommitted])
		return
	case !reserved && o.reserve.settled && counts[lineNotHeld] != lines:
		c.HalfHeld++
		c.detail("order %s: refused, yet %d lines held and %d committed", o.key, counts[lineHeld], counts[lineCommitted])
		return
	}
	want := map[OrderState]lineClass{OrderHeld: lineHeld, OrderCommitted: lineCommitted, OrderFailed: lineNotHeld, OrderReleased: lineNotHeld}
	if k, ok := want[got.order.State]; ok && lines > 0 && counts[k] != lines {
		c.Reconciliation++
		c.detail("order %s: state %s, but its lines are %s", o.key, got.order.State, firstClass(counts))
	}
	if committed && (got.order.State != OrderCommitted || counts[lineCommitted] != lines) {
		c.Lost++
		c.detail("order %s: acknowledged as committed, the system has it %s with %d of %d lines committed",
			o.key, got.order.State, counts[lineCommitted], lines)
	}
	if committed {
		for _, l := range got.order.Lines {
			clientSold[l.SKU] += l.Qty
		}
	}

	for _, r := range o.refunds {
		if applied(r.s.ok, r.s.replayed) == 0 {
			if !r.s.settled {
				c.Unresolved++
			}
			continue
		}
		orig := SaleOfReservation(r.reservationID)
		ackRefund[orig] += r.qty
		clientSold[r.sku] -= r.qty
		if got := st.SKUs[r.sku].Refunded[orig]; got < ackRefund[orig] {
			c.Lost++
			c.detail("order %s: refund of %s acknowledged, the system refunded %d of %d", o.key, orig, got, ackRefund[orig])
		}
	}
}

// firstClass names the class most lines are in.
func firstClass(counts [3]int) lineClass {
	best := lineNotHeld
	for k := range counts {
		if counts[k] > counts[best] {
			best = lineClass(k)
		}
	}
	return best
}
