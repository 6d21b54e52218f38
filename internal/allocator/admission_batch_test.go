package allocator_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// batchCounting is an admission store that counts its entry batches and
// the entries in them.
type batchCounting struct {
	*postgres.DB
	batches, entries atomic.Int64
}

func (b *batchCounting) EnterTickets(ctx context.Context, sku string, entries []stock.TicketEntry, waitlistMax, perCustomer int64,
	free func(context.Context) (int64, bool, error), route stock.EntryRoute) ([]stock.TicketEntered, error) {
	b.batches.Add(1)
	b.entries.Add(int64(len(entries)))
	return b.DB.EnterTickets(ctx, sku, entries, waitlistMax, perCustomer, free, route)
}

// TestAdmission_Batches: RequestTokens of one SKU entered in batches by
// two admission services (two allocators, two pools) on one database
// keep every bound a request entered alone keeps, across the batches of
// both: the units in tokens never exceed the stock and every token is the
// one hold of its ticket's key; a customer never has more than
// tokens_per_customer tickets open or admitted (each sends its keys
// through both services at once); the waitlist never holds more than
// waitlist_max; a key sent twice at once (through both) answers one
// ticket, or is refused both times.
func TestAdmission_Batches(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const (
		sku       = "batches"
		units     = 40
		customers = 300
		keysEach  = 2 // one through each service
		twiceEach = 5 // every fifth key is also sent again at once
		waitMax   = 30
		crowdMax  = 2 * time.Minute
	)
	s.createAdmissionSKU(sku, 2, units, stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: 10 * time.Minute,
		WaitlistMax: waitMax, TokensPerCustomer: 1})
	var stores []*batchCounting
	var svcs []*admission.Service
	for i := range 2 {
		db, err := postgres.Open(ctx, s.url, postgres.Options{MaxConns: 8, ApplicationName: fmt.Sprintf("batchtest-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		store := &batchCounting{DB: db}
		stores = append(stores, store)
		svcs = append(svcs, admission.New(store, s.newAllocator(), nil)) // no worker: the waitlist only grows
	}
	stopWatch := make(chan struct{})
	watched := s.watchConserved(sku, units, svcs[0], stopWatch)

	type sent struct {
		key, customer string
		quantity      int64
		ans           admission.Answer
		err           error
	}
	var calls []*sent
	for c := range customers {
		for k := range keysEach {
			n := len(calls)
			call := &sent{key: fmt.Sprintf("c%d-k%d", c, k), customer: fmt.Sprintf("cust-%d", c), quantity: int64(1 + n%2)}
			calls = append(calls, call)
			if n%twiceEach == 0 {
				again := *call
				calls = append(calls, &again)
			}
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() {
			c.ans, c.err = svcs[i%2].RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: c.quantity, Key: c.key, CustomerRef: c.customer})
		})
	}
	wg.Wait()
	if took := time.Since(start); took > crowdMax {
		t.Fatalf("%d requests took %s, more than %s (machine overloaded?)", len(calls), took, crowdMax)
	}
	close(stopWatch)
	<-watched
	var batches, entries int64
	for _, st := range stores {
		batches, entries = batches+st.batches.Load(), entries+st.entries.Load()
	}
	t.Logf("%d requests in %s, %d entry batches", len(calls), time.Since(start), batches)
	if batches >= entries {
		t.Errorf("%d entries in %d batches: no batch held two", entries, batches)
	}

	byKey := map[string]*sent{}
	open := map[string]int{} // customer -> tickets waiting or admitted
	var inTokens int64
	waiting, full, limited := 0, 0, 0
	tokens := map[string]string{} // token -> ticket
	for _, c := range calls {
		if first, ok := byKey[c.key]; ok {
			// Two refusals may differ (WAITLIST_FULL, then
			// CUSTOMER_LIMIT_REACHED): a refused key records nothing and
			// is decided afresh. A key recorded answers its ticket.
			switch {
			case (first.err == nil) != (c.err == nil):
				t.Errorf("key %s answered %v and %v", c.key, first.err, c.err)
			case c.err == nil && first.ans.Ticket.ID != c.ans.Ticket.ID:
				t.Errorf("key %s answered tickets %s and %s, want one", c.key, first.ans.Ticket.ID, c.ans.Ticket.ID)
			}
			continue
		}
		byKey[c.key] = c
		switch code := stock.CodeOf(c.err); {
		case c.err == nil:
		case code == stock.CodeWaitlistFull:
			full++
			continue
		case code == stock.CodeCustomerLimitReached:
			limited++
			continue
		default:
			t.Fatalf("RequestToken(%s) = %v", c.key, c.err)
		}
		tk := c.ans.Ticket
		open[c.customer]++
		switch tk.State {
		case stock.TicketAdmitted:
			inTokens += tk.Quantity
			if other, ok := tokens[tk.TokenID]; ok {
				t.Errorf("tickets %s and %s share token %s", other, tk.ID, tk.TokenID)
			}
			tokens[tk.TokenID] = tk.ID
			op, err := s.db.GetOperation(ctx, sku, tk.ReserveKey())
			if err != nil || op.ReservationID != tk.TokenID || op.ReservationState != stock.ReservationHeld {
				t.Errorf("ticket %s: token %s, reserve %+v, %v; want its one held reservation", tk.ID, tk.TokenID, op, err)
			}
		case stock.TicketWaiting:
			waiting++
		default:
			t.Errorf("RequestToken(%s) = ticket %+v, want a token or a waiting ticket", c.key, tk)
		}
	}
	t.Logf("%d units in tokens, %d waiting, %d WAITLIST_FULL, %d CUSTOMER_LIMIT_REACHED", inTokens, waiting, full, limited)
	for c, n := range open {
		if n > 1 {
			t.Errorf("customer %s has %d tickets waiting or admitted, want at most tokens_per_customer 1", c, n)
		}
	}
	if waiting > waitMax {
		t.Errorf("%d tickets waited, want at most waitlist_max %d", waiting, waitMax)
	}
	if n, err := svcs[1].Waitlist(ctx, sku); err != nil || n != int64(waiting) {
		t.Errorf("Waitlist(%s) = %d, %v; want %d", sku, n, err, waiting)
	}
	st, err := s.alloc.GetStock(ctx, sku)
	if err != nil || inTokens > units || st.Total.Reserved != inTokens {
		t.Fatalf("%d units in tokens; GetStock(%s) = %+v, %v; want at most %d, every hold a token", inTokens, sku, st.Total, err, units)
	}
	if full == 0 || limited == 0 {
		t.Errorf("%d WAITLIST_FULL, %d CUSTOMER_LIMIT_REACHED: the crowd did not reach both bounds", full, limited)
	}
	s.balanced(sku)
}
