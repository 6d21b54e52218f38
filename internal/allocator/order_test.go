package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/stock"
)

// orderAllocator is an allocator over the stack that keeps orders in the
// stack's database; recovery off: it never takes over another's orders.
func (s *stack) orderAllocator(recovery bool, hook func(*stock.Order, int)) *allocator.Allocator {
	return s.newAllocatorWith(func(c *allocator.Config) {
		c.Orders, c.OrderRecoveryOff, c.OrderHook = s.db, !recovery, hook
	})
}

// lineHeld returns the reservation an order's line holds now, or nil.
func (s *stack) lineHeld(orderID, sku string) *stock.Operation {
	s.t.Helper()
	op, err := s.store.GetOperation(context.Background(), sku, stock.OrderLineKey(orderID, sku))
	if stock.CodeOf(err) == stock.CodeOperationNotFound {
		return nil
	}
	if err != nil {
		s.t.Fatalf("GetOperation(line %s of %s) = %v", sku, orderID, err)
	}
	if op.ReservationState != stock.ReservationHeld {
		return nil
	}
	return op
}

// TestOrder_AllOrNothing: 200 carts of 2 to 5 lines over 10 SKUs, whose
// stock covers about half of them, sent at once through two allocators:
// each order is held whole or not at all, none waits past its deadline, no
// SKU is oversold, and the books balance; then half the held orders are
// committed and half released, each as a whole.
func TestOrder_AllOrNothing(t *testing.T) {
	s := newStack(t, []string{"a", "b"}, "")
	ctx := context.Background()
	const skus, carts, stockPerSKU = 10, 200, 50
	for i := range skus {
		s.createSKU(fmt.Sprintf("cart-%d", i), 2, stockPerSKU)
	}
	allocs := []*allocator.Allocator{s.orderAllocator(true, nil), s.orderAllocator(true, nil)}
	rng := rand.New(rand.NewPCG(32, 1))
	orders := make([]*stock.Order, carts)
	for c := range orders {
		o := &stock.Order{IdempotencyKey: fmt.Sprintf("cart-%d", c), OrderRef: fmt.Sprintf("ord-%d", c)}
		for _, k := range rng.Perm(skus)[:2+rng.IntN(4)] {
			o.Lines = append(o.Lines, stock.OrderLine{SKU: fmt.Sprintf("cart-%d", k), Quantity: 1 + rng.Int64N(2)})
		}
		orders[c] = o
	}
	const deadline = 20 * time.Second
	got := make([]*stock.Order, carts)
	errs := make([]error, carts)
	var wg sync.WaitGroup
	for c := range orders {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			got[c], _, errs[c] = allocs[c%2].ReserveOrder(cctx, orders[c])
		})
	}
	wg.Wait()
	held := map[string]int64{}
	whole, refused := 0, 0
	for c, o := range got {
		switch code := stock.CodeOf(errs[c]); {
		case errs[c] == nil:
			whole++
			if o.State != stock.OrderHeld {
				t.Errorf("order %d = %s, want held", c, o.State)
			}
			for _, l := range o.Lines {
				if op := s.lineHeld(o.ID, l.SKU); op == nil || op.Quantity != l.Quantity || op.ReservationID != l.ReservationID {
					t.Errorf("held order %d: line %s holds %+v, want %d units", c, l.SKU, op, l.Quantity)
				}
				held[l.SKU] += l.Quantity
			}
		case code == stock.CodeOutOfStock || code == stock.CodeShardUnavailable || code == stock.CodeOrderFailed:
			// Refused whole: out of stock, or its stock kept moving
			// (SHARD_UNAVAILABLE: a retry with the same key goes on;
			// ORDER_FAILED: a line's answer stayed unknown).
			refused++
			var e *stock.Error
			if !errors.As(errs[c], &e) || !strings.HasPrefix(e.Metadata["sku"], "cart-") {
				t.Errorf("refused order %d: %v names no sku", c, errs[c])
			}
			for _, l := range o.Lines {
				if op := s.lineHeld(o.ID, l.SKU); op != nil {
					t.Errorf("refused order %d: line %s still holds %d", c, l.SKU, op.Quantity)
				}
			}
		default:
			t.Errorf("order %d = %v, want held or OUT_OF_STOCK (no cart may wait on another past its deadline)", c, errs[c])
		}
	}
	t.Logf("%d orders held whole, %d refused whole", whole, refused)
	if whole == 0 || refused == 0 {
		t.Errorf("%d held, %d refused: the stock was meant to cover about half", whole, refused)
	}
	for i := range skus {
		sku := fmt.Sprintf("cart-%d", i)
		c := s.counts(sku)
		if c.Reserved != held[sku] || c.Available+c.Reserved != stockPerSKU || !c.Valid() {
			t.Errorf("%s = %+v, want %d reserved by the held orders, %d in all", sku, c, held[sku], stockPerSKU)
		}
	}
	// End each held order as a whole: even ones committed, odd released.
	sold := map[string]int64{}
	for c, o := range got {
		if errs[c] != nil {
			continue
		}
		end, want := allocs[(c+1)%2].CommitOrder, stock.OrderCommitted
		if c%2 == 1 {
			end, want = func(ctx context.Context, id string) (*stock.Order, bool, error) {
				return allocs[(c+1)%2].ReleaseOrder(ctx, id, "payment failed")
			}, stock.OrderReleased
		}
		done, _, err := end(ctx, o.ID)
		if err != nil || done.State != want {
			t.Errorf("ending order %d = %+v, %v, want %s", c, done, err, want)
			continue
		}
		for _, l := range o.Lines {
			if want == stock.OrderCommitted {
				sold[l.SKU] += l.Quantity
			}
		}
	}
	for i := range skus {
		sku := fmt.Sprintf("cart-%d", i)
		if c := s.counts(sku); c.Sold != sold[sku] || c.Reserved != 0 || c.Available+c.Sold != stockPerSKU {
			t.Errorf("%s = %+v, want %d sold by the committed orders, nothing held", sku, c, sold[sku])
		}
		s.balanced(sku)
	}
}

// TestOrder_CrashMidway: the driver of an order stops after two of its
// three lines are held (its lease runs out, as when its process dies).
// Another allocator's recovery releases both within OrderRecoveryBound and
// fails the order; a retry with the same key gets that one outcome; the
// old driver, woken, takes no further line. Without the recovery
// (OrderRecoveryOff on the other allocator) the lines stay held and this
// test fails.
func TestOrder_CrashMidway(t *testing.T) {
	s := newStack(t, []string{"a", "b"}, "")
	ctx := context.Background()
	for _, sku := range []string{"crash-a", "crash-b", "crash-c"} {
		s.createSKU(sku, 1, 10)
	}
	stopped, wake := make(chan *stock.Order, 1), make(chan struct{})
	driver := s.orderAllocator(false, func(o *stock.Order, line int) {
		if line == 2 {
			stopped <- o
			<-wake // the driver "dies" here: it renews its lease no more
		}
	})
	recovery := s.orderAllocator(true, nil)
	const caller = "service:token:0123456789ab"
	o := &stock.Order{IdempotencyKey: "crash-1", Lines: []stock.OrderLine{{SKU: "crash-c", Quantity: 1}, {SKU: "crash-a", Quantity: 2}, {SKU: "crash-b", Quantity: 3}},
		Caller: caller}
	type answer struct {
		o   *stock.Order
		err error
	}
	driven := make(chan answer, 1)
	go func() {
		got, _, err := driver.ReserveOrder(ctx, o)
		driven <- answer{got, err}
	}()
	var midway *stock.Order
	select {
	case midway = <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the driver never reached its third line")
	}
	// First prove the crash landed midway: two lines held.
	if s.lineHeld(midway.ID, "crash-a") == nil || s.lineHeld(midway.ID, "crash-b") == nil {
		t.Fatalf("the driver stopped with lines a, b not held")
	}
	start := time.Now()
	failed := func() bool {
		o, err := recovery.GetOrder(ctx, midway.ID, "")
		return err == nil && o.State == stock.OrderFailed
	}
	for s.lineHeld(midway.ID, "crash-a") != nil || s.lineHeld(midway.ID, "crash-b") != nil || !failed() {
		if time.Since(start) > allocator.OrderRecoveryBound {
			close(wake)
			t.Fatalf("lines of the stopped order still held, or the order not failed, after %s (OrderRecoveryBound)", allocator.OrderRecoveryBound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the stopped order's lines were released and it failed %s after the driver stopped", time.Since(start).Round(time.Millisecond))
	// The recovery, which has only the order's row, names the order's
	// caller on the releases it wrote, as the driver did on the reserves.
	for _, sku := range []string{"crash-a", "crash-b"} {
		kinds := map[stock.OpKind]int{}
		entries, err := recovery.ListLedger(ctx, sku, 0, 1000)
		if err != nil {
			t.Fatalf("ListLedger(%s) = %v", sku, err)
		}
		for _, e := range entries {
			if e.Source != stock.SourceOrder {
				continue
			}
			kinds[e.Kind]++
			if e.Caller != caller {
				t.Errorf("%s: the order line's %s entry names caller %q, want the order's %q", sku, e.Kind, e.Caller, caller)
			}
		}
		if kinds[stock.OpReserve] != 1 || kinds[stock.OpRelease] != 1 {
			t.Errorf("%s: the order line's entries %v, want one reserve and one release", sku, kinds)
		}
	}
	retry, replayed, err := recovery.ReserveOrder(ctx, &stock.Order{IdempotencyKey: "crash-1", Lines: o.Lines})
	if !replayed || retry.State != stock.OrderFailed || stock.CodeOf(err) != stock.CodeOrderFailed {
		t.Errorf("ReserveOrder(crash-1) again = %+v, %v, %v; want the one outcome: failed (ORDER_FAILED), replayed", retry, replayed, err)
	}
	close(wake)
	a := <-driven
	if a.err == nil || a.o.State != stock.OrderFailed {
		t.Errorf("the woken driver answered %+v, %v; want the order failed", a.o, a.err)
	}
	for _, sku := range []string{"crash-a", "crash-b", "crash-c"} {
		if op := s.lineHeld(midway.ID, sku); op != nil {
			t.Errorf("line %s held after the woken driver went on", sku)
		}
		if c := s.counts(sku); c.Available != 10 {
			t.Errorf("%s = %+v, want all 10 available", sku, c)
		}
		s.balanced(sku)
	}
}

// TestOrder_AbandonedRetry: a client that abandons its ReserveOrder
// midway and retries with the same key gets the order's one outcome, not
// OPERATION_IN_PROGRESS:
//
//   - Live: the caller leaves after the first line is held; the drive goes
//     on without it, and a retry through another allocator, sent while
//     the driver still works, waits for it and answers the order held
//     whole (replayed), every line held once.
//   - Dead: the driver stops after its first line and never goes on; a
//     retry waits for the recovery and answers the failed order within
//     OrderRecoveryBound, nothing held.
//
// Seen failing before the drive outlived its caller and retries waited:
// both retries answered OPERATION_IN_PROGRESS at once.
func TestOrder_AbandonedRetry(t *testing.T) {
	s := newStack(t, []string{"a", "b"}, "")
	ctx := context.Background()
	skus := []string{"aband-a", "aband-b", "aband-c"}
	for _, sku := range skus {
		s.createSKU(sku, 1, 10)
	}
	left, reached, dead := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var leave context.CancelFunc
	driver := s.orderAllocator(false, func(o *stock.Order, line int) {
		switch {
		case o.IdempotencyKey == "aband-live" && line == 1:
			leave() // the client abandons its request here
			close(left)
			time.Sleep(500 * time.Millisecond) // the driver still at work when the retry comes
		case o.IdempotencyKey == "aband-dead" && line == 1:
			close(reached)
			<-dead // the driver "dies": it renews its lease no more
		}
	})
	t.Cleanup(func() { close(dead) })
	other := s.orderAllocator(true, nil)
	// Each call has lines of its own, as each request has: the drive
	// writes its reservations into them.
	lines := []stock.OrderLine{{SKU: "aband-a", Quantity: 1}, {SKU: "aband-b", Quantity: 2}, {SKU: "aband-c", Quantity: 3}}

	t.Run("Live", func(t *testing.T) {
		var cctx context.Context
		cctx, leave = context.WithCancel(ctx)
		abandoned := make(chan error, 1)
		go func() {
			_, _, err := driver.ReserveOrder(cctx, &stock.Order{IdempotencyKey: "aband-live", Lines: slices.Clone(lines)})
			abandoned <- err
		}()
		<-left
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		got, replayed, err := other.ReserveOrder(rctx, &stock.Order{IdempotencyKey: "aband-live", Lines: slices.Clone(lines)})
		if err != nil || !replayed || got.State != stock.OrderHeld {
			t.Fatalf("ReserveOrder(aband-live) retried while its driver works = %+v, %v, %v; want the order held, replayed", got, replayed, err)
		}
		if err := <-abandoned; stock.CodeOf(err) != stock.CodeOperationInProgress {
			t.Errorf("the abandoned call answered %v, want OPERATION_IN_PROGRESS", err)
		}
		for _, l := range got.Lines {
			if op := s.lineHeld(got.ID, l.SKU); op == nil || op.Quantity != l.Quantity || op.ReservationID != l.ReservationID {
				t.Errorf("line %s holds %+v, want %d units under %s", l.SKU, op, l.Quantity, l.ReservationID)
			}
		}
		if _, _, err := other.CommitOrder(ctx, got.ID); err != nil {
			t.Fatalf("CommitOrder(%s) = %v", got.ID, err)
		}
		for _, l := range lines {
			if c := s.counts(l.SKU); c.Sold != l.Quantity || c.Reserved != 0 {
				t.Errorf("%s = %+v, want %d sold once, none held", l.SKU, c, l.Quantity)
			}
			s.balanced(l.SKU)
		}
	})

	t.Run("Dead", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		go driver.ReserveOrder(dctx, &stock.Order{IdempotencyKey: "aband-dead", Lines: slices.Clone(lines)})
		<-reached
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		defer rcancel()
		got, replayed, err := other.ReserveOrder(rctx, &stock.Order{IdempotencyKey: "aband-dead", Lines: slices.Clone(lines)})
		took := time.Since(start)
		if !replayed || got.State != stock.OrderFailed || stock.CodeOf(err) != stock.CodeOrderFailed || took > allocator.OrderRecoveryBound {
			t.Fatalf("ReserveOrder(aband-dead) retried = %+v, %v, %v after %s; want the failed order within %s", got, replayed, err, took, allocator.OrderRecoveryBound)
		}
		t.Logf("the retry answered the dead driver's order failed after %s", took.Round(time.Millisecond))
		for _, sku := range skus {
			if op := s.lineHeld(got.ID, sku); op != nil {
				t.Errorf("line %s of the failed order still held", sku)
			}
		}
	})
}

// TestOrder_Hostile: bad orders are refused with their codes before
// anything is held, lines can only end with their order, and a line's
// refusal names its SKU in the ErrorInfo.
func TestOrder_Hostile(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	s.createSKU("h-1", 1, 10)
	s.createSKU("h-2", 1, 1)
	a := s.orderAllocator(true, nil)
	inv := &api.InventoryHandler{Inventory: a}
	reserve := func(key string, lines ...*v1.OrderLine) (*v1.ReserveOrderResponse, error) {
		resp, err := inv.ReserveOrder(ctx, connect.NewRequest(&v1.ReserveOrderRequest{IdempotencyKey: key, Lines: lines}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	line := func(sku string, q int64) *v1.OrderLine { return &v1.OrderLine{Sku: sku, Quantity: q} }
	var many []*v1.OrderLine
	for i := range stock.OrderLinesMax + 1 {
		many = append(many, line(fmt.Sprintf("h-%d", i), 1))
	}
	before1, before2 := s.counts("h-1"), s.counts("h-2")
	for _, tc := range []struct {
		name  string
		key   string
		lines []*v1.OrderLine
		code  stock.Code
	}{
		{"NoLines", "x1", nil, stock.CodeInvalidArgument},
		{"51Lines", "x2", many, stock.CodeInvalidArgument},
		{"SKUTwice", "x3", []*v1.OrderLine{line("h-1", 1), line("h-1", 1)}, stock.CodeInvalidArgument},
		{"Overflow", "x4", []*v1.OrderLine{line("h-1", math.MaxInt64), line("h-2", math.MaxInt64)}, stock.CodeInvalidQuantity},
		{"Zero", "x5", []*v1.OrderLine{line("h-1", 0)}, stock.CodeInvalidQuantity},
		{"BadSKU", "x6", []*v1.OrderLine{line("h 1", 1)}, stock.CodeInvalidSKU},
		{"NoKey", "", []*v1.OrderLine{line("h-1", 1)}, stock.CodeInvalidIdempotencyKey},
		{"UnknownSKU", "x7", []*v1.OrderLine{line("h-1", 1), line("nope", 1)}, stock.CodeSKUNotFound},
		{"OutOfStock", "x8", []*v1.OrderLine{line("h-1", 2), line("h-2", 2)}, stock.CodeOutOfStock},
	} {
		_, err := reserve(tc.key, tc.lines...)
		wantCode(t, "ReserveOrder("+tc.name+")", err, tc.code)
	}
	// The refused line is named: h-2, not h-1 (held, then released).
	_, err := reserve("x8", line("h-1", 2), line("h-2", 2))
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if info, ok := v.(*errdetails.ErrorInfo); ok && info.Metadata["sku"] != "h-2" {
					t.Errorf("ReserveOrder(h-2 short) ErrorInfo metadata = %v, want sku h-2", info.Metadata)
				}
			}
		}
	}
	if a1, a2 := s.counts("h-1"), s.counts("h-2"); a1 != before1 || a2 != before2 {
		t.Errorf("refused orders moved stock: %+v -> %+v, %+v -> %+v", before1, a1, before2, a2)
	}
	// A client cannot take a line's key, nor end a line alone.
	_, err = inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: "h-1", Quantity: 1, IdempotencyKey: stock.OrderLineKeyPrefix + "x"}))
	wantCode(t, "Reserve(a line's key)", err, stock.CodeInvalidIdempotencyKey)
	ok, err := reserve("ok", line("h-1", 1))
	if err != nil {
		t.Fatal(err)
	}
	_, err = inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: ok.Order.Lines[0].ReservationId}))
	wantCode(t, "Commit(a line alone)", err, stock.CodeInvalidArgument)
	_, err = inv.CommitOrder(ctx, connect.NewRequest(&v1.CommitOrderRequest{OrderId: "o1.nope"}))
	wantCode(t, "CommitOrder(unknown)", err, stock.CodeOrderNotFound)
	got, err := inv.GetOrder(ctx, connect.NewRequest(&v1.GetOrderRequest{IdempotencyKey: "ok"}))
	if err != nil || got.Msg.Order.State != v1.OrderState_ORDER_STATE_HELD {
		t.Errorf("GetOrder(ok) = %v, %v, want held", got, err)
	}
	if _, err := inv.ReleaseOrder(ctx, connect.NewRequest(&v1.ReleaseOrderRequest{OrderId: ok.Order.OrderId})); err != nil {
		t.Errorf("ReleaseOrder = %v", err)
	}
	_, err = inv.CommitOrder(ctx, connect.NewRequest(&v1.CommitOrderRequest{OrderId: ok.Order.OrderId}))
	wantCode(t, "CommitOrder(released)", err, stock.CodeReservationAlreadyReleased)
	s.balanced("h-1")
	s.balanced("h-2")
}

// TestOrder_SourceCase: the source document's case (100 units, 500
// requests, 50 of them repeating an earlier key) run as orders of one line
// gives what deducts give (internal/e2e's sourceCase): 100 keys held, each
// once, every repeat the same outcome as its first (a repeat that finds
// its order still being driven asks again, as a client after
// OPERATION_IN_PROGRESS), and once the held orders are committed, 100 sold.
func TestOrder_SourceCase(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const sku = "case"
	s.createSKU(sku, 8, 100)
	a := s.orderAllocator(true, nil)
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = fmt.Sprintf("case-order-%03d", i)
		if i >= 450 {
			keys[i] = keys[i-450]
		}
	}
	got := make([]*stock.Order, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	// At most 100 at once: the test's database pool has 8 connections,
	// and a cart of one line costs it as much as a deduct twice over.
	slots := make(chan struct{}, 100)
	for i, k := range keys {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			for range 100 {
				got[i], _, errs[i] = a.ReserveOrder(ctx, &stock.Order{IdempotencyKey: k, Lines: []stock.OrderLine{{SKU: sku, Quantity: 1}}})
				if stock.CodeOf(errs[i]) != stock.CodeOperationInProgress {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	held := map[string]string{}
	for i, err := range errs {
		switch code := stock.CodeOf(err); {
		case err == nil:
			if id, ok := held[keys[i]]; ok && id != got[i].ID {
				t.Errorf("key %s held two orders", keys[i])
			}
			held[keys[i]] = got[i].ID
		case code != stock.CodeOutOfStock:
			t.Errorf("ReserveOrder(%s) = %v, want held or OUT_OF_STOCK", keys[i], err)
		}
	}
	for i := 450; i < 500; i++ {
		if (errs[i] == nil) != (errs[i-450] == nil) {
			t.Errorf("key %s: %v / %v disagree", keys[i], errs[i-450], errs[i])
		}
	}
	if len(held) != 100 {
		t.Errorf("orders held = %d, want 100", len(held))
	}
	for _, id := range held {
		if _, _, err := a.CommitOrder(ctx, id); err != nil {
			t.Errorf("CommitOrder(%s) = %v", id, err)
		}
	}
	if c := s.counts(sku); c.Available != 0 || c.Sold != 100 || c.Reserved != 0 {
		t.Errorf("stock = %+v, want 100 sold, none left", c)
	}
	s.balanced(sku)
}
