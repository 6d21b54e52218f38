package allocator_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// countingTickets is an admission store that counts its calls (each one
// query or more).
type countingTickets struct {
	db      *postgres.DB
	queries atomic.Int64
}

var _ admission.Store = (*countingTickets)(nil)

func (c *countingTickets) EnterTickets(ctx context.Context, sku string, entries []stock.TicketEntry, waitlistMax, perCustomer int64,
	free func(context.Context) (int64, bool, error), route stock.EntryRoute) ([]stock.TicketEntered, error) {
	c.queries.Add(1)
	return c.db.EnterTickets(ctx, sku, entries, waitlistMax, perCustomer, free, route)
}
func (c *countingTickets) WaitTicket(ctx context.Context, id string, waitlistMax int64) (*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.WaitTicket(ctx, id, waitlistMax)
}
func (c *countingTickets) DropTicket(ctx context.Context, id string) error {
	c.queries.Add(1)
	return c.db.DropTicket(ctx, id)
}
func (c *countingTickets) ClaimTickets(ctx context.Context, ids []string) ([]string, error) {
	c.queries.Add(1)
	return c.db.ClaimTickets(ctx, ids)
}
func (c *countingTickets) AdmitTickets(ctx context.Context, marks []stock.TicketMark) ([]*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.AdmitTickets(ctx, marks)
}
func (c *countingTickets) CancelTicket(ctx context.Context, id string) (*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.CancelTicket(ctx, id)
}
func (c *countingTickets) SoldOutTicket(ctx context.Context, id string) (*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.SoldOutTicket(ctx, id)
}
func (c *countingTickets) SoldOutWaiting(ctx context.Context, sku string, stale time.Duration) (int64, error) {
	c.queries.Add(1)
	return c.db.SoldOutWaiting(ctx, sku, stale)
}
func (c *countingTickets) GetTicket(ctx context.Context, id string) (*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.GetTicket(ctx, id)
}
func (c *countingTickets) GetTickets(ctx context.Context, ids []string) ([]*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.GetTickets(ctx, ids)
}
func (c *countingTickets) GetTicketByKey(ctx context.Context, sku, key string) (*stock.Ticket, error) {
	c.queries.Add(1)
	return c.db.GetTicketByKey(ctx, sku, key)
}
func (c *countingTickets) OpenTickets(ctx context.Context, sku string, stale time.Duration, limit int) ([]*stock.Ticket, int64, error) {
	c.queries.Add(1)
	return c.db.OpenTickets(ctx, sku, stale, limit)
}
func (c *countingTickets) OpenTicketSKUs(ctx context.Context, limit int) ([]string, error) {
	c.queries.Add(1)
	return c.db.OpenTicketSKUs(ctx, limit)
}
func (c *countingTickets) WaitingCount(ctx context.Context, sku string) (int64, error) {
	c.queries.Add(1)
	return c.db.WaitingCount(ctx, sku)
}
func (c *countingTickets) WaitingTotal(ctx context.Context) (int64, error) {
	c.queries.Add(1)
	return c.db.WaitingTotal(ctx)
}
func (c *countingTickets) TicketKeys(ctx context.Context, sku string, limit int, each func(string)) (int, bool, error) {
	c.queries.Add(1)
	return c.db.TicketKeys(ctx, sku, limit, each)
}
func (c *countingTickets) RegisterTicket(ctx context.Context, t stock.Ticket, params []byte, registrationsMax int64, open bool,
	granted func(context.Context) (*stock.Ticket, error)) (*stock.Ticket, bool, error) {
	c.queries.Add(1)
	return c.db.RegisterTicket(ctx, t, params, registrationsMax, open, granted)
}
func (c *countingTickets) SeedDraw(ctx context.Context, sku string, seed []byte) ([]byte, error) {
	c.queries.Add(1)
	return c.db.SeedDraw(ctx, sku, seed)
}
func (c *countingTickets) RankDraw(ctx context.Context, sku string, order func(seed []byte, ids []string) []string) (bool, error) {
	c.queries.Add(1)
	return c.db.RankDraw(ctx, sku, order)
}
func (c *countingTickets) GetDraw(ctx context.Context, sku string, after int64, limit int) (*stock.Draw, error) {
	c.queries.Add(1)
	return c.db.GetDraw(ctx, sku, after, limit)
}

// tokenFront is an admission service with no worker over a marked
// allocator, both counting their queries, and its registry.
type tokenFront struct {
	alloc   *allocator.Allocator
	db      *countingDB
	tickets *countingTickets
	svc     *admission.Service
	reg     *prometheus.Registry
}

func (s *stack) newTokenFront() *tokenFront {
	s.t.Helper()
	f := &tokenFront{db: &countingDB{DB: s.db}, tickets: &countingTickets{db: s.db}, reg: prometheus.NewRegistry()}
	f.alloc = s.newMarked(f.db)
	f.svc = admission.New(f.tickets, f.alloc, f.reg)
	return f
}

func (f *tokenFront) queries() int64 { return f.db.queries.Load() + f.tickets.queries.Load() }

// refusals reads shardstock_admission_soldout_memory_refusals_total (the
// gather also reads the waitlist gauge: one query of f's ticket store).
func (f *tokenFront) refusals(t *testing.T) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "shardstock_admission_soldout_memory_refusals_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no shardstock_admission_soldout_memory_refusals_total")
	return 0
}

// untilTokenFromMemory asks f for tokens with new keys until it refuses
// one from memory, and returns how long that took.
func untilTokenFromMemory(t *testing.T, f *tokenFront, sku, prefix string) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		before := f.refusals(t)
		_, err := f.svc.RequestToken(context.Background(), admission.TokenRequest{SKU: sku, Quantity: 1, Key: fmt.Sprintf("%s-%d", prefix, i)})
		if stock.CodeOf(err) != stock.CodeOutOfStock {
			t.Fatalf("RequestToken(%s %s-%d) = %v, want OUT_OF_STOCK", sku, prefix, i, err)
		}
		if f.refusals(t) > before {
			return time.Since(start)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%s: no RequestToken refused from memory within 5 s of the sell-out", sku)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// soldOutTokens: a SKU under admission, sold out for good (its tokens
// bought), is refused from memory at both fronts within a second: 10,000
// RequestToken calls with new keys make no query (the allocators' nor the
// ticket store's) and no shard call. A key that got a token before still
// gets that token (replayed), a key that got a ticket its ticket; a
// replenish reopens the SKU for the other front at once.
func soldOutTokens(t *testing.T, s *stack) {
	ctx := context.Background()
	a, b := s.newTokenFront(), s.newTokenFront()
	const sku = "tok-drop"
	s.createAdmissionSKU(sku, 2, 3, stock.Admission{Mode: stock.AdmissionTokens, WaitlistMax: 10, TokenTTL: time.Minute})
	request := func(f *tokenFront, key string) (admission.Answer, error) {
		return f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: key})
	}
	// Three tokens, then a ticket (a fourth request while all three are
	// held); two tokens bought, one released: the ticket is admitted
	// (by a worker of its own, on the stack's database) and bought.
	first := map[string]*stock.Ticket{}
	for i := range 4 {
		key := fmt.Sprint("early-", i)
		ans, err := request(a, key)
		if err != nil {
			t.Fatalf("RequestToken(%s) = %v", key, err)
		}
		first[key] = ans.Ticket
	}
	if st := first["early-3"].State; st != stock.TicketWaiting {
		t.Fatalf("RequestToken(early-3) with every unit held = %s, want WAITING", st)
	}
	worker := s.newAdmission("tokens-worker", s.alloc, nil)
	defer worker.halt() // the stack's next tests want no worker of their own SKUs
	for i, key := range []string{"early-0", "early-1", "early-2"} {
		kind := stock.OpCommit
		if i == 2 {
			kind = stock.OpRelease
		}
		if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: kind, ReservationID: first[key].TokenID, Reason: "test"}); res.Err != nil {
			t.Fatalf("EndReservation(%s %s) = %v", kind, key, res.Err)
		}
	}
	var admitted *stock.Ticket
	for deadline := time.Now().Add(5 * time.Second); ; {
		tk, err := worker.svc.GetTicket(ctx, first["early-3"].ID, "", "")
		if err == nil && tk.State == stock.TicketAdmitted {
			admitted = tk
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetTicket(early-3) = %+v, %v; want ADMITTED within 5 s of a release", tk, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpCommit, ReservationID: admitted.TokenID}); res.Err != nil {
		t.Fatalf("EndReservation(commit early-3's token) = %v", res.Err)
	}

	for name, f := range map[string]*tokenFront{"A": a, "B": b} {
		if d := untilTokenFromMemory(t, f, sku, "learn-"+name); d > time.Second {
			t.Errorf("front %s refused RequestToken from memory %s after the sell-out, want within 1 s", name, d)
		}
	}

	const calls = 10000
	// The registry's gather reads the waitlist gauge (a query): the
	// refusals are read outside the counted span.
	refusals := a.refusals(t) + b.refusals(t)
	queries := a.queries() + b.queries()
	shardCalls := a.alloc.ShardRequests() + b.alloc.ShardRequests()
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for w := range 8 {
		f := a
		if w%2 == 1 {
			f = b
		}
		wg.Go(func() {
			for i := w; i < calls; i += 8 {
				if _, err := request(f, fmt.Sprint("new-", i)); stock.CodeOf(err) != stock.CodeOutOfStock {
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Errorf("%d of %d RequestToken calls with new keys of a sold-out SKU not answered OUT_OF_STOCK", n, calls)
	}
	if got := a.queries() + b.queries() - queries; got != 0 {
		t.Errorf("%d RequestToken calls with new keys made %d queries, want 0", calls, got)
	}
	if got := a.alloc.ShardRequests() + b.alloc.ShardRequests() - shardCalls; got != 0 {
		t.Errorf("%d RequestToken calls with new keys made %v shard calls, want 0", calls, got)
	}
	if got := a.refusals(t) + b.refusals(t) - refusals; got != calls {
		t.Errorf("%v RequestToken refusals from memory, want %d", got, calls)
	}

	// Replays get their first result at either front: a token, and the
	// ticket (now admitted); with another quantity, IDEMPOTENCY_KEY_REUSED.
	for _, f := range []*tokenFront{a, b} {
		ans, err := request(f, "early-0")
		if err != nil || !ans.Replayed || ans.Ticket.TokenID != first["early-0"].TokenID {
			t.Errorf("RequestToken(early-0) after the sell-out = %+v, %v; want its token %s replayed", ans.Ticket, err, first["early-0"].TokenID)
		}
		ans, err = request(f, "early-3")
		if err != nil || !ans.Replayed || ans.Ticket.ID != first["early-3"].ID || ans.Ticket.TokenID != admitted.TokenID {
			t.Errorf("RequestToken(early-3) after the sell-out = %+v, %v; want its ticket %s (token %s) replayed", ans.Ticket, err, first["early-3"].ID, admitted.TokenID)
		}
		if _, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 2, Key: "early-1"}); stock.CodeOf(err) != stock.CodeIdempotencyKeyReused {
			t.Errorf("RequestToken(early-1, 2 units) after the sell-out = %v, want IDEMPOTENCY_KEY_REUSED", err)
		}
	}

	// A replenish through A's allocator reopens the SKU at B by the time
	// it returns, within a second.
	start := time.Now()
	if res := a.alloc.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: "restock"}); res.Err != nil {
		t.Fatalf("AdjustStock(replenish 1) = %v", res.Err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the replenish of a sold-out SKU took %s, want within 1 s", d)
	}
	ans, err := request(b, "after-restock")
	if err != nil || ans.Ticket.State != stock.TicketAdmitted {
		t.Errorf("RequestToken(after-restock) at B once a replenish through A returned = %+v, %v; want a token", ans.Ticket, err)
	} else if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: ans.Ticket.TokenID}); res.Err != nil {
		t.Errorf("EndReservation(release after-restock) = %v", res.Err)
	}
	s.balanced(sku)
}

// soldOutTokensWaiting: a SKU sold out for good while tickets still wait
// (no worker has answered them SOLD_OUT yet) is not answered from memory:
// a new key then still becomes a waiting ticket, and its replay must get
// that ticket. Once a worker answers the waitlist SOLD_OUT, the fronts
// refuse from memory, and the ticket's key still gets its own answer.
// Keys read while a ticket waited would fail it.
func soldOutTokensWaiting(t *testing.T, s *stack) {
	ctx := context.Background()
	f := s.newTokenFront()
	const sku = "tok-waiting"
	s.createAdmissionSKU(sku, 1, 1, stock.Admission{Mode: stock.AdmissionTokens, WaitlistMax: 10, TokenTTL: time.Minute})
	request := func(key string) (admission.Answer, error) {
		return f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: key})
	}
	tok, err := request("tok")
	if err != nil || tok.Ticket.State != stock.TicketAdmitted {
		t.Fatalf("RequestToken(tok) = %+v, %v; want a token", tok.Ticket, err)
	}
	if ans, err := request("w-1"); err != nil || ans.Ticket.State != stock.TicketWaiting {
		t.Fatalf("RequestToken(w-1) with the unit held = %+v, %v; want WAITING", ans.Ticket, err)
	}
	if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpCommit, ReservationID: tok.Ticket.TokenID}); res.Err != nil {
		t.Fatalf("EndReservation(commit tok) = %v", res.Err)
	}
	// Sold out for good, the waitlist unanswered: the front's allocator
	// marks it (a check that finds it so starts the marking).
	if _, gone, err := f.alloc.Availability(ctx, sku); err != nil || !gone {
		t.Fatalf("Availability(%s) = %v, %v; want sold out for good", sku, gone, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := f.alloc.SoldOutMark(sku); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not marked sold out within 5 s", sku)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A first new key (it waits too) starts a key read; w-2 comes after it.
	if ans, err := request("w-probe"); err != nil || ans.Ticket.State != stock.TicketWaiting {
		t.Fatalf("RequestToken(w-probe) behind a waiting ticket = %+v, %v; want WAITING", ans.Ticket, err)
	}
	time.Sleep(300 * time.Millisecond)
	w2, err := request("w-2")
	if err != nil || w2.Ticket.State != stock.TicketWaiting {
		t.Fatalf("RequestToken(w-2) behind a waiting ticket = %+v, %v; want WAITING", w2.Ticket, err)
	}
	// Long enough for any key read to have run (keyReadInterval).
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		ans, err := request("w-2")
		if err != nil || !ans.Replayed || ans.Ticket.ID != w2.Ticket.ID {
			t.Fatalf("RequestToken(w-2) again while it waits = %+v, %v; want its ticket %s replayed", ans.Ticket, err, w2.Ticket.ID)
		}
	}
	if n := f.refusals(t); n != 0 {
		t.Errorf("%v refusals from memory while tickets waited, want none", n)
	}

	// A worker answers the waitlist SOLD_OUT: then the front refuses from
	// memory, and w-2's replay is its answer, OUT_OF_STOCK.
	defer s.newAdmission("tokens-waiting-worker", s.alloc, nil).halt()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tk, err := f.svc.GetTicket(ctx, w2.Ticket.ID, "", "")
		if err == nil && tk.State == stock.TicketSoldOut {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetTicket(w-2) = %+v, %v; want SOLD_OUT within 5 s of a worker's start", tk, err)
		}
	}
	if d := untilTokenFromMemory(t, f, sku, "later"); d > time.Second {
		t.Errorf("refused from memory %s after the waitlist was answered, want within 1 s", d)
	}
	if _, err := request("w-2"); stock.CodeOf(err) != stock.CodeOutOfStock {
		t.Errorf("RequestToken(w-2) once its ticket is SOLD_OUT = %v, want OUT_OF_STOCK", err)
	}
	s.balanced(sku)
}

// soldOutTokensStalePending: a ticket left PENDING by a process that died
// before its reserve does not keep a SKU sold out for good from being
// answered from memory: once it is stale, the worker that finds the SKU
// sold out for good answers it SOLD_OUT with the waitlist, and the fronts
// then refuse new keys from memory. Left open, it would keep the key read
// (TicketKeys) from ever being kept.
func soldOutTokensStalePending(t *testing.T, s *stack) {
	ctx := context.Background()
	f := s.newTokenFront()
	const sku = "tok-stale"
	s.createAdmissionSKU(sku, 1, 1, stock.Admission{Mode: stock.AdmissionTokens, WaitlistMax: 10, TokenTTL: time.Minute})
	tok, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: "tok"})
	if err != nil || tok.Ticket.State != stock.TicketAdmitted {
		t.Fatalf("RequestToken(tok) = %+v, %v; want a token", tok.Ticket, err)
	}
	// The dead process's entry: it read the unit free (before tok took
	// it), recorded its ticket PENDING, and died before its reserve; its
	// ticket is older than the worker's pendingStale (10 s).
	got, err := s.db.EnterTickets(ctx, sku, []stock.TicketEntry{{Ticket: stock.Ticket{Quantity: 1, IdempotencyKey: "dead"}, Params: []byte("p")}},
		10, 0, func(context.Context) (int64, bool, error) { return 1, false, nil }, nil)
	if err != nil || got[0].Err != nil || got[0].Ticket.State != stock.TicketPending {
		t.Fatalf("EnterTickets(dead) = %+v, %v; want a PENDING ticket", got, err)
	}
	dead := got[0].Ticket
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE admission_tickets SET created_at = now() - interval '1 minute' WHERE ticket_id = $1`, dead.ID); err != nil {
		t.Fatal(err)
	}
	if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpCommit, ReservationID: tok.Ticket.TokenID}); res.Err != nil {
		t.Fatalf("EndReservation(commit tok) = %v", res.Err)
	}
	defer s.newAdmission("tokens-stale-worker", s.alloc, nil).halt()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tk, err := f.svc.GetTicket(ctx, dead.ID, "", "")
		if err == nil && tk.State == stock.TicketSoldOut {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetTicket(dead) = %+v, %v; want SOLD_OUT within 5 s of a worker's start", tk, err)
		}
	}
	if d := untilTokenFromMemory(t, f, sku, "after-dead"); d > time.Second {
		t.Errorf("refused from memory %s after the stale ticket was answered, want within 1 s", d)
	}
	if _, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: "tok"}); err != nil {
		t.Errorf("RequestToken(tok) after the sell-out = %v, want its token replayed", err)
	}
	s.balanced(sku)
}
