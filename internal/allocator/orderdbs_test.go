package allocator_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/stock"
)

// placedSKUs creates, in name order, one SKU per entry of dbs, each placed
// on that database, and returns their names; it fails unless each lives
// in its database and nowhere else.
func (s *stack) placedSKUs(prefix string, initial int64, dbs ...string) []string {
	s.t.Helper()
	set := s.store.(*dbset.Set)
	var names []string
	for i := 0; len(names) < len(dbs) && i < 1000; i++ {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		if set.Placement().Newest(name) == dbs[len(names)] {
			names = append(names, name)
		}
	}
	if len(names) < len(dbs) {
		s.t.Fatalf("no SKU names placed %v", dbs)
	}
	for i, name := range names {
		s.createSKU(name, 1, initial)
		for _, db := range set.Names() {
			_, err := set.DB(db).GetSKU(context.Background(), name)
			if (err == nil) != (db == dbs[i]) {
				s.t.Fatalf("%s in database %s: %v; placed on %s", name, db, err, dbs[i])
			}
		}
	}
	return names
}

// waitOrderEnd waits, at most bound, until the order is in state want and
// no line of it is held; it returns how long that took.
func (s *stack) waitOrderEnd(a *allocator.Allocator, id string, skus []string, want stock.OrderState, bound time.Duration) (time.Duration, bool) {
	start := time.Now()
	for {
		o, err := a.GetOrder(context.Background(), id, "")
		held := false
		for _, sku := range skus {
			held = held || s.lineHeld(id, sku) != nil
		}
		if err == nil && o.State == want && !held {
			return time.Since(start), true
		}
		if time.Since(start) > bound {
			return time.Since(start), false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOrder_CrashMidwayTwoDatabases: orders whose lines are placed on two
// databases (the order itself in main), their driver stopped midway, are
// finished by another allocator's recovery within OrderRecoveryBound,
// each line once and all alike: released, or committed, never both.
//
//   - Pending: the driver stops before its fifth line, with four held,
//     two in each database; the fourth (in second) is not yet in the
//     order's row, so the recovery must find it by its derived key in the
//     SKU's own database. Every line is released, the order fails, a retry
//     of its key answers that one outcome, and the woken driver holds
//     nothing.
//   - Committing: a held order whose driver recorded committing and
//     committed its first line (in main) before it died: the recovery
//     commits the rest (in second and main); every line sold, none
//     released.
//
// Without the recovery (OrderRecoveryOff on the other allocator) the
// lines stay held and both parts fail.
func TestOrder_CrashMidwayTwoDatabases(t *testing.T) {
	s := newStackDBs(t, []string{"a", "b"}, "", true)
	ctx := context.Background()
	main, second := stock.DefaultDatabase, "second"
	skus := s.placedSKUs("cross", 10, main, second, main, second, main)
	stopped, wake := make(chan *stock.Order, 1), make(chan struct{})
	driver := s.orderAllocator(false, func(o *stock.Order, line int) {
		if o.IdempotencyKey == "cross-1" && line == 4 {
			stopped <- o
			<-wake // the driver "dies" here: it renews its lease no more
		}
	})
	recovery := s.orderAllocator(true, nil)

	t.Run("Pending", func(t *testing.T) {
		var lines []stock.OrderLine
		for i, sku := range skus {
			lines = append(lines, stock.OrderLine{SKU: sku, Quantity: int64(i + 1)})
		}
		type answer struct {
			o   *stock.Order
			err error
		}
		driven := make(chan answer, 1)
		go func() {
			got, _, err := driver.ReserveOrder(ctx, &stock.Order{IdempotencyKey: "cross-1", Lines: lines})
			driven <- answer{got, err}
		}()
		var midway *stock.Order
		select {
		case midway = <-stopped:
		case <-time.After(20 * time.Second):
			t.Fatal("the driver never reached its fifth line")
		}
		defer func() {
			select {
			case <-wake:
			default:
				close(wake)
			}
		}()
		// First prove the crash landed midway: four lines held, two in
		// each database, and the fourth not in the order's row.
		for i, sku := range skus[:4] {
			if s.lineHeld(midway.ID, sku) == nil {
				t.Fatalf("the driver stopped with line %d (%s) not held", i, sku)
			}
		}
		if s.lineHeld(midway.ID, skus[4]) != nil {
			t.Fatalf("the driver stopped with its fifth line already held")
		}
		row, err := s.db.GetOrder(ctx, midway.ID, "")
		if err != nil || row.State != stock.OrderPending || row.Lines[3].ReservationID != "" || row.Lines[2].ReservationID == "" {
			t.Fatalf("order row at the stop = %+v, %v; want pending, lines 0-2 recorded and 3 not", row, err)
		}
		took, ok := s.waitOrderEnd(recovery, midway.ID, skus, stock.OrderFailed, allocator.OrderRecoveryBound)
		if !ok {
			t.Fatalf("lines of the stopped order still held, or the order not failed, after %s (OrderRecoveryBound)", took.Round(time.Millisecond))
		}
		t.Logf("the stopped order's lines, in two databases, were released and it failed %s after the driver stopped", took.Round(time.Millisecond))
		retry, replayed, err := recovery.ReserveOrder(ctx, &stock.Order{IdempotencyKey: "cross-1", Lines: lines})
		if !replayed || retry.ID != midway.ID || retry.State != stock.OrderFailed || stock.CodeOf(err) != stock.CodeOrderFailed {
			t.Errorf("ReserveOrder(cross-1) again = %+v, %v, %v; want the one outcome: failed (ORDER_FAILED), replayed", retry, replayed, err)
		}
		close(wake)
		a := <-driven
		if a.err == nil || a.o.State != stock.OrderFailed {
			t.Errorf("the woken driver answered %+v, %v; want the order failed", a.o, a.err)
		}
		for _, sku := range skus {
			if s.lineHeld(midway.ID, sku) != nil {
				t.Errorf("line %s held after the woken driver went on", sku)
			}
			if c := s.counts(sku); c.Available != 10 || c.Sold != 0 {
				t.Errorf("%s = %+v, want all 10 available, none sold", sku, c)
			}
			s.balanced(sku)
		}
	})

	t.Run("Committing", func(t *testing.T) {
		o, _, err := driver.ReserveOrder(ctx, &stock.Order{IdempotencyKey: "cross-2",
			Lines: []stock.OrderLine{{SKU: skus[0], Quantity: 2}, {SKU: skus[1], Quantity: 3}, {SKU: skus[2], Quantity: 4}}})
		if err != nil {
			t.Fatalf("ReserveOrder(cross-2) = %v", err)
		}
		// The driver's steps up to its death: committing recorded, its
		// first line committed; its lease ran out (written as past).
		o.State = stock.OrderCommitting
		if ok, err := s.db.SetOrder(ctx, o, stock.OrderHeld, "dead-driver", time.Millisecond, true); err != nil || !ok {
			t.Fatalf("SetOrder(committing) = %v, %v", ok, err)
		}
		if res := driver.EndReservation(ctx, &stock.Request{Kind: stock.OpCommit, ReservationID: o.Lines[0].ReservationID, Source: stock.SourceOrder}); res.Err != nil {
			t.Fatalf("commit of line 0 = %v", res.Err)
		}
		if c := s.counts(skus[0]); c.Sold != 2 {
			t.Fatalf("%s after its line's commit = %+v, want 2 sold", skus[0], c)
		}
		names := []string{skus[0], skus[1], skus[2]}
		took, ok := s.waitOrderEnd(recovery, o.ID, names, stock.OrderCommitted, allocator.OrderRecoveryBound)
		if !ok {
			t.Fatalf("the committing order not committed after %s (OrderRecoveryBound)", took.Round(time.Millisecond))
		}
		t.Logf("the committing order was committed %s after its driver stopped", took.Round(time.Millisecond))
		for i, l := range o.Lines {
			if c := s.counts(l.SKU); c.Sold != l.Quantity || c.Available != 10-l.Quantity || c.Reserved != 0 {
				t.Errorf("%s = %+v, want %d sold, none held", l.SKU, c, l.Quantity)
			}
			line := func(e *stock.LedgerEntry) bool { return e.ReservationID == l.ReservationID && e.Kind != stock.OpExtend }
			if got := s.ledgerKinds(l.SKU, line); !slices.Equal(got, []string{fmt.Sprintf("reserve %d", l.Quantity), fmt.Sprintf("commit %d", l.Quantity)}) {
				t.Errorf("line %d (%s) ledger = %v, want its reserve and one commit", i, l.SKU, got)
			}
			s.balanced(l.SKU)
		}
		got, replayed, err := recovery.CommitOrder(ctx, o.ID)
		if err != nil || !replayed || got.State != stock.OrderCommitted {
			t.Errorf("CommitOrder(cross-2) again = %+v, %v, %v; want committed, replayed", got, replayed, err)
		}
	})
}
