package allocator_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// The public API's handlers over the stack's allocator: the calls below
// convert proto to domain and back as a client's do.
func (s *stack) inventory() *api.InventoryHandler { return &api.InventoryHandler{Inventory: s.alloc} }

// createSKUWith creates a SKU through the allocator with its settings.
func (s *stack) createSKUWith(sku stock.SKU, initial int64) {
	s.t.Helper()
	if _, err := s.alloc.CreateSKU(context.Background(), sku, initial); err != nil {
		s.t.Fatalf("CreateSKU(%+v, %d) = %v", sku, initial, err)
	}
}

// counts is a SKU's totals.
func (s *stack) counts(sku string) stock.Counts {
	s.t.Helper()
	st, err := s.alloc.GetStock(context.Background(), sku)
	if err != nil {
		s.t.Fatalf("GetStock(%s) = %v", sku, err)
	}
	return st.Total
}

// ledgerKinds lists the kinds of a SKU's ledger entries that pass keep.
func (s *stack) ledgerKinds(sku string, keep func(*stock.LedgerEntry) bool) []string {
	s.t.Helper()
	es, err := s.alloc.ListLedger(context.Background(), sku, 0, 1000)
	if err != nil {
		s.t.Fatalf("ListLedger(%s) = %v", sku, err)
	}
	var out []string
	for _, e := range es {
		if keep(e) {
			out = append(out, fmt.Sprintf("%s %d", e.Kind, e.Quantity))
		}
	}
	return out
}

// wantCode fails unless err carries reason code ("" for no error).
func wantCode(t *testing.T, call string, err error, code stock.Code) {
	t.Helper()
	if got := stock.Code(wire.Reason(err)); got != code || (code == "" && err != nil) {
		t.Errorf("%s = %v (reason %q), want %q", call, err, got, code)
	}
}

// TestInventory_HoldsBend: through the public API, a held reservation is
// extended within its SKU's max_hold (never shortened, refused past it
// and once ended or expired), then committed in part: the rest is
// released in the same step, back to stock and to the customer's quota,
// with one ledger entry each; a SKU with a customer limit refuses a
// request that names no customer.
func TestInventory_HoldsBend(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const sku = "bend"
	s.createSKUWith(stock.SKU{Name: sku, Shards: 1, CustomerLimit: 5, MaxHold: time.Hour}, 10)
	inv := s.inventory()
	reserve := func(key string, q int64, ttl time.Duration) *v1.Reservation {
		t.Helper()
		resp, err := inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: q, IdempotencyKey: key,
			CustomerRef: "carol", OrderRef: "order-" + key, Ttl: durationpb.New(ttl)}))
		if err != nil {
			t.Fatalf("Reserve(%s) = %v", key, err)
		}
		return resp.Msg.Reservation
	}
	extend := func(id string, ttl time.Duration) (*v1.ExtendReservationResponse, error) {
		resp, err := inv.ExtendReservation(ctx, connect.NewRequest(&v1.ExtendReservationRequest{ReservationId: id, Ttl: durationpb.New(ttl)}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	commit := func(id string, q int64) (*v1.CommitResponse, error) {
		resp, err := inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: id, Quantity: q}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}

	t.Run("CustomerRefRequired", func(t *testing.T) {
		before := s.counts(sku)
		_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: "nobody"}))
		wantCode(t, "Deduct(no customer_ref)", err, stock.CodeCustomerRefRequired)
		_, err = inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: "nobody-hold"}))
		wantCode(t, "Reserve(no customer_ref)", err, stock.CodeCustomerRefRequired)
		if after := s.counts(sku); after != before {
			t.Errorf("refused calls moved stock %+v -> %+v", before, after)
		}
	})

	hold := reserve("h1", 3, time.Minute)
	t.Run("Extend", func(t *testing.T) {
		got, err := extend(hold.ReservationId, 30*time.Minute)
		if err != nil || got.Replayed || !got.Reservation.ExpiresAt.AsTime().After(hold.ExpiresAt.AsTime().Add(25*time.Minute)) {
			t.Fatalf("ExtendReservation(30m) = %+v, %v, want a hold ~30 min from now", got, err)
		}
		shorter, err := extend(hold.ReservationId, 10*time.Second)
		if err != nil || !shorter.Replayed || !shorter.Reservation.ExpiresAt.AsTime().Equal(got.Reservation.ExpiresAt.AsTime()) {
			t.Errorf("ExtendReservation(10s) = %+v, %v, want the 30 min hold, replayed", shorter, err)
		}
		_, err = extend(hold.ReservationId, 2*time.Hour)
		wantCode(t, "ExtendReservation(past max_hold)", err, stock.CodeHoldLimitReached)
		_, err = extend(hold.ReservationId, 0)
		wantCode(t, "ExtendReservation(no ttl)", err, stock.CodeInvalidArgument)
		expiring := reserve("h-expiring", 1, time.Second)
		time.Sleep(1100 * time.Millisecond)
		_, err = extend(expiring.ReservationId, time.Minute)
		wantCode(t, "ExtendReservation(expired)", err, stock.CodeReservationExpired)
	})

	t.Run("PartialCommit", func(t *testing.T) {
		before := s.counts(sku)
		_, err := commit(hold.ReservationId, 4)
		wantCode(t, "Commit(4 of 3 held)", err, stock.CodeInvalidQuantity)
		_, err = commit(hold.ReservationId, -1)
		wantCode(t, "Commit(-1)", err, stock.CodeInvalidQuantity)
		if after := s.counts(sku); after != before {
			t.Errorf("refused commits moved stock %+v -> %+v", before, after)
		}
		got, err := commit(hold.ReservationId, 2)
		if err != nil || got.Reservation.State != v1.ReservationState_RESERVATION_STATE_COMMITTED || got.Reservation.CommittedQuantity != 2 {
			t.Fatalf("Commit(2 of 3) = %+v, %v, want committed, 2 bought", got, err)
		}
		if after, want := s.counts(sku), before.Add(stock.Counts{Available: 1, Reserved: -3, Sold: 2}); after != want {
			t.Errorf("after Commit(2 of 3) stock = %+v, want %+v", after, want)
		}
		again, err := commit(hold.ReservationId, 2)
		if err != nil || !again.Replayed || again.Reservation.CommittedQuantity != 2 {
			t.Errorf("Commit again = %+v, %v, want the first, replayed", again, err)
		}
		_, err = extend(hold.ReservationId, time.Minute)
		wantCode(t, "ExtendReservation(committed)", err, stock.CodeReservationAlreadyCommitted)
		// carol holds 2 of her 5 now: the released unit came back to her.
		_, err = inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 3, IdempotencyKey: "carol-3", CustomerRef: "carol"}))
		wantCode(t, "Deduct(3 more for carol)", err, "")
		_, err = inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: "carol-4", CustomerRef: "carol"}))
		wantCode(t, "Deduct(past carol's limit)", err, stock.CodeCustomerLimitReached)
	})

	entries := s.ledgerKinds(sku, func(e *stock.LedgerEntry) bool { return e.ReservationID == hold.ReservationId })
	if want := []string{"reserve 3", "extend 3", "commit 2", "release 1"}; fmt.Sprint(entries) != fmt.Sprint(want) {
		t.Errorf("the hold's ledger entries = %v, want %v", entries, want)
	}
	s.balanced(sku)
}

// TestInventory_Refunds: a refund names its sale and returns at most what
// it sold, in all, to stock and to the customer's quota; its key replays;
// its ledger entry names the sale. Twenty refunds of one sale at once,
// half of them on another shard than the sale's (as when the sale's shard
// was retired), return at most what it sold.
func TestInventory_Refunds(t *testing.T) {
	s := newStack(t, []string{"a", "b"}, "")
	ctx := context.Background()
	sku := apart(t, s, "refunds")
	s.createSKUWith(stock.SKU{Name: sku, Shards: 2, CustomerLimit: 3}, 100)
	s.createSKU("refunds-other", 1, 10)
	inv := s.inventory()
	deduct := func(sku, key string, q int64, customer string) *v1.Operation {
		t.Helper()
		resp, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: q, IdempotencyKey: key, CustomerRef: customer}))
		if err != nil {
			t.Fatalf("Deduct(%s, %d) = %v", key, q, err)
		}
		return resp.Msg.Operation
	}
	refund := func(key string, sale *v1.Sale, q int64) (*v1.RefundResponse, error) {
		resp, err := inv.Refund(ctx, connect.NewRequest(&v1.RefundRequest{Sku: sku, IdempotencyKey: key, Original: sale, Quantity: q, Reason: "payment failed"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	byKey := func(k string) *v1.Sale { return &v1.Sale{Sale: &v1.Sale_DeductKey{DeductKey: k}} }

	start := s.counts(sku)
	deduct(sku, "sale-1", 3, "dave")
	_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: "dave-more", CustomerRef: "dave"}))
	wantCode(t, "Deduct(past dave's limit)", err, stock.CodeCustomerLimitReached)

	t.Run("TwoThenOne", func(t *testing.T) {
		first, err := refund("rf-1", byKey("sale-1"), 2)
		if err != nil || first.Replayed || first.Operation.Kind != v1.OperationKind_OPERATION_KIND_REFUND || first.Operation.Original.GetDeductKey() != "sale-1" {
			t.Fatalf("Refund(2 of sale-1) = %+v, %v", first, err)
		}
		if again, err := refund("rf-1", byKey("sale-1"), 2); err != nil || !again.Replayed {
			t.Errorf("Refund(rf-1 again) = %+v, %v, want replayed", again, err)
		}
		_, err = refund("rf-1", byKey("sale-1"), 1)
		wantCode(t, "Refund(rf-1, another quantity)", err, stock.CodeIdempotencyKeyReused)
		if _, err := refund("rf-2", byKey("sale-1"), 1); err != nil {
			t.Fatalf("Refund(the last 1 of sale-1) = %v", err)
		}
		_, err = refund("rf-3", byKey("sale-1"), 1)
		wantCode(t, "Refund(beyond sale-1)", err, stock.CodeRefundExceedsSale)
		if got := s.counts(sku); got != start {
			t.Errorf("stock after refunding the whole sale = %+v, want %+v", got, start)
		}
		// dave's quota is back by 3.
		deduct(sku, "dave-again", 3, "dave")
		entries := s.ledgerKinds(sku, func(e *stock.LedgerEntry) bool { return e.Original.DeductKey == "sale-1" })
		if want := []string{"refund 2", "refund 1"}; fmt.Sprint(entries) != fmt.Sprint(want) {
			t.Errorf("ledger entries naming sale-1 = %v, want %v", entries, want)
		}
	})

	t.Run("CommittedReservation", func(t *testing.T) {
		resp, err := inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 2, IdempotencyKey: "hold-r", CustomerRef: "erin"}))
		if err != nil {
			t.Fatal(err)
		}
		id := resp.Msg.Reservation.ReservationId
		sale := &v1.Sale{Sale: &v1.Sale_ReservationId{ReservationId: id}}
		_, err = refund("rf-held", sale, 1)
		wantCode(t, "Refund(a held reservation)", err, stock.CodeSaleNotFound)
		if _, err := inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: id, Quantity: 1})); err != nil {
			t.Fatal(err)
		}
		_, err = refund("rf-r2", sale, 2)
		wantCode(t, "Refund(2 of a reservation that bought 1)", err, stock.CodeRefundExceedsSale)
		if _, err := refund("rf-r1", sale, 1); err != nil {
			t.Errorf("Refund(1 of a reservation that bought 1) = %v", err)
		}
	})

	t.Run("Hostile", func(t *testing.T) {
		deduct("refunds-other", "other-sale", 1, "dave")
		other, err := s.alloc.GetStock(ctx, "refunds-other")
		if err != nil {
			t.Fatal(err)
		}
		before, otherBefore := s.counts(sku), other.Total
		foreign := stock.NewReservationID(stock.ShardKey{SKU: "refunds-other"})
		for _, tc := range []struct {
			name string
			sale *v1.Sale
			q    int64
			code stock.Code
		}{
			{"NoOriginal", nil, 1, stock.CodeInvalidArgument},
			{"DeductOfAnotherSKU", byKey("other-sale"), 1, stock.CodeSaleNotFound},
			{"ReservationOfAnotherSKU", &v1.Sale{Sale: &v1.Sale_ReservationId{ReservationId: foreign}}, 1, stock.CodeSaleNotFound},
			{"ForgedReservation", &v1.Sale{Sale: &v1.Sale_ReservationId{ReservationId: "r1.x.0.y"}}, 1, stock.CodeSaleNotFound},
			{"UnknownKey", byKey("never-sold"), 1, stock.CodeSaleNotFound},
			{"BadKey", byKey("a b"), 1, stock.CodeInvalidArgument},
			{"QuantityZero", byKey("dave-again"), 0, stock.CodeInvalidQuantity},
			{"QuantityOverflow", byKey("dave-again"), 1 << 62, stock.CodeInvalidQuantity},
			{"ARefundIsNoSale", byKey("rf-1"), 1, stock.CodeSaleNotFound},
		} {
			_, err := refund("hostile-"+tc.name, tc.sale, tc.q)
			wantCode(t, "Refund("+tc.name+")", err, tc.code)
		}
		other, err = s.alloc.GetStock(ctx, "refunds-other")
		if err != nil {
			t.Fatal(err)
		}
		if after := s.counts(sku); after != before || other.Total != otherBefore {
			t.Errorf("refused refunds moved stock: %+v -> %+v, other %+v -> %+v", before, after, otherBefore, other.Total)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		sale := deduct(sku, "sale-big", 3, "gina")
		// The other shard must have sold enough to take a refund at all.
		elsewhere := stock.ShardKey{SKU: sku, Index: 1 - sale.Shard}
		if res := s.owner(elsewhere).Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: elsewhere, Quantity: 3, Key: "pad", CustomerRef: "fred", Source: stock.SourceAPI}); res.Err != nil {
			t.Fatalf("deduct on shard %d = %v", elsewhere.Index, res.Err)
		}
		before := s.counts(sku)
		const refunds = 20
		var wg sync.WaitGroup
		results := make([]stock.Code, refunds)
		for i := range refunds {
			wg.Go(func() {
				key := fmt.Sprintf("rf-c-%d", i)
				if i%2 == 0 {
					_, err := refund(key, byKey("sale-big"), 1)
					results[i] = stock.Code(wire.Reason(err))
					return
				}
				// Straight to the other shard's writer: a refund that
				// landed elsewhere than the sale.
				res := s.owner(elsewhere).Do(ctx, &stock.Request{Kind: stock.OpRefund, Shard: elsewhere, Quantity: 1, Key: key,
					Original: stock.Sale{DeductKey: "sale-big"}, Source: stock.SourceAPI})
				results[i] = codeOf(res)
			})
		}
		wg.Wait()
		ok, where := 0, map[stock.Code]int{}
		for _, c := range results {
			where[c]++
			if c == "" {
				ok++
			}
		}
		if ok != 3 || where[stock.CodeRefundExceedsSale] != refunds-3 {
			t.Errorf("20 refunds of 1 of a sale of 3: %v, want 3 successes and 17 REFUND_EXCEEDS_SALE", where)
		}
		if after, want := s.counts(sku), before.Add(stock.Counts{Available: 3, Sold: -3}); after != want {
			t.Errorf("stock after the refunds = %+v, want %+v", after, want)
		}
	})
	s.balanced(sku)
	s.balanced("refunds-other")
}

// apart returns a SKU name from prefix whose shards 0 and 1 have two
// owners: their writers' transactions run at once, on two servers.
func apart(t *testing.T, s *stack, prefix string) string {
	t.Helper()
	for i := range 100 {
		name := fmt.Sprintf("%s-%d", prefix, i)
		a, _, _ := s.topo().Owner(stock.PartitionOf(name, 0))
		b, _, _ := s.topo().Owner(stock.PartitionOf(name, 1))
		if a.ID != b.ID {
			return name
		}
	}
	t.Fatalf("no %s-N with shards on two servers", prefix)
	return ""
}

// TestInventory_OnePerOrder: on a SKU that applies an order once per
// kind, a second key with the same order_ref is refused
// ORDER_ALREADY_APPLIED naming the first key, also when ten race on two
// shards; another kind, a replay of the first key and another SKU are not.
func TestInventory_OnePerOrder(t *testing.T) {
	s := newStack(t, []string{"a", "b"}, "")
	ctx := context.Background()
	sku := apart(t, s, "once")
	s.createSKUWith(stock.SKU{Name: sku, Shards: 2, OnePerOrder: true}, 100)
	s.createSKU("many", 1, 100)
	inv := s.inventory()
	deduct := func(sku, key, order string) (*v1.DeductResponse, error) {
		resp, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: key, OrderRef: order}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	if _, err := deduct(sku, "k1", "o1"); err != nil {
		t.Fatalf("Deduct(k1, o1) = %v", err)
	}
	before := s.counts(sku)
	_, err := deduct(sku, "k2", "o1")
	wantCode(t, "Deduct(k2, o1)", err, stock.CodeOrderAlreadyApplied)
	if err == nil || !strings.Contains(err.Error(), `"k1"`) {
		t.Errorf("Deduct(k2, o1) = %v, want the message to name k1", err)
	}
	if after := s.counts(sku); after != before {
		t.Errorf("a refused deduct moved stock %+v -> %+v", before, after)
	}
	if again, err := deduct(sku, "k1", "o1"); err != nil || !again.Replayed {
		t.Errorf("Deduct(k1, o1) again = %+v, %v, want replayed", again, err)
	}
	if _, err := inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: "k3", OrderRef: "o1"})); err != nil {
		t.Errorf("Reserve(k3, o1) = %v, want another kind applied", err)
	}
	_, err = inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: "k4", OrderRef: "o1"}))
	wantCode(t, "Reserve(k4, o1)", err, stock.CodeOrderAlreadyApplied)
	for _, k := range []string{"m1", "m2"} {
		if _, err := deduct("many", k, "o1"); err != nil {
			t.Errorf("Deduct(%s, o1) on a SKU without one_per_order = %v", k, err)
		}
	}

	// Ten keys at once, each sent straight to one of the two shards'
	// writers: one applies the order, whichever shard it is on.
	var wg sync.WaitGroup
	codes := make([]stock.Code, 10)
	for i := range codes {
		wg.Go(func() {
			k := stock.ShardKey{SKU: sku, Index: int32(i % 2)}
			res := s.owner(k).Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: k, Quantity: 1, Key: fmt.Sprintf("race-%d", i),
				OrderRef: "o-race", Source: stock.SourceAPI})
			codes[i] = codeOf(res)
		})
	}
	wg.Wait()
	won := 0
	for _, c := range codes {
		switch c {
		case "":
			won++
		case stock.CodeOrderAlreadyApplied:
		default:
			t.Errorf("racing deduct = %s, want success or ORDER_ALREADY_APPLIED", c)
		}
	}
	if won != 1 {
		t.Errorf("%d of 10 racing keys applied order o-race, want 1 (%v)", won, codes)
	}
	s.balanced(sku)
}
