package allocator_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestAdmission_Direct: a SKU under ADMISSION_MODE_TOKENS without
// tokens_per_customer grants a token directly, with no ticket, while units
// are free and no ticket is queued (docs/admission.md, "Direct grants").
// The token is a reservation under the request's own key
// (stock.TokenKey), so that its retry, GetTicket by key, and a retry
// behind a waitlist that formed since all answer that token, and a retry
// with other parameters is IDEMPOTENCY_KEY_REUSED. Once tickets wait, a
// new request waits behind them, and the units that come back go to the
// oldest ticket, reserved under its request's key too.
func TestAdmission_Direct(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const sku = "direct"
	s.createAdmissionSKU(sku, 2, 3, stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: time.Minute, WaitlistMax: 10})
	side := s.newAdmission("direct", s.alloc, nil)
	request := func(key string, q int64) (admission.Answer, error) {
		return side.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: q, Key: key, CustomerRef: "cust-" + key})
	}
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows := func() (n int) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1`, sku).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	held := func(what, key, token string) {
		t.Helper()
		op, err := s.db.GetOperation(ctx, sku, stock.TokenKey(sku, key))
		if err != nil || op.ReservationID != token || op.ReservationState != stock.ReservationHeld || op.CustomerRef != "cust-"+key {
			t.Errorf("%s: the reserve under its request's key = %+v, %v; want token %s held for cust-%s", what, op, err, token, key)
		}
	}

	// Units free, no ticket: tokens with no ticket row.
	k1, err := request("k1", 1)
	if err != nil || k1.Replayed || k1.Ticket.State != stock.TicketAdmitted || !k1.Ticket.Direct || k1.Ticket.ID != "" || k1.Ticket.TokenID == "" {
		t.Fatalf("RequestToken(k1) = %+v, %v; want a token granted directly, with no ticket", k1.Ticket, err)
	}
	held("k1", "k1", k1.Ticket.TokenID)
	k2, err := request("k2", 2)
	if err != nil || !k2.Ticket.Direct || k2.Ticket.ID != "" {
		t.Fatalf("RequestToken(k2, 2 units) = %+v, %v; want a token granted directly", k2.Ticket, err)
	}
	if n := rows(); n != 0 {
		t.Errorf("%d ticket rows after two tokens granted directly, want 0", n)
	}
	if again, err := request("k1", 1); err != nil || !again.Replayed || again.Ticket.TokenID != k1.Ticket.TokenID {
		t.Errorf("RequestToken(k1) again = %+v, %v; want its token %s, replayed", again.Ticket, err, k1.Ticket.TokenID)
	}
	if _, err := request("k1", 2); stock.CodeOf(err) != stock.CodeIdempotencyKeyReused {
		t.Errorf("RequestToken(k1, 2 units) = %v, want IDEMPOTENCY_KEY_REUSED", err)
	}
	got, err := side.svc.GetTicket(ctx, "", sku, "k1")
	if err != nil || got.State != stock.TicketAdmitted || got.TokenID != k1.Ticket.TokenID || got.CustomerRef != "cust-k1" || got.Quantity != 1 {
		t.Errorf("GetTicket(%s, k1) = %+v, %v; want ADMITTED with token %s", sku, got, err, k1.Ticket.TokenID)
	}
	if _, err := side.svc.GetTicket(ctx, "", sku, "never"); stock.CodeOf(err) != stock.CodeTicketNotFound {
		t.Errorf("GetTicket(%s, never) = %v, want TICKET_NOT_FOUND", sku, err)
	}

	// Every unit held, the SKU still never ticketed: copies of one key
	// sent at once, each refused for stock directly and entered, with
	// copies still asking directly in the same batches, answer one
	// ticket.
	const copies = 20
	dups := make([]admission.Answer, copies)
	dupErrs := make([]error, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { dups[i], dupErrs[i] = request("w1", 1) })
	}
	wg.Wait()
	var first *stock.Ticket
	for i := range copies {
		if dupErrs[i] == nil && first == nil {
			first = dups[i].Ticket
		}
	}
	if first == nil {
		t.Fatalf("RequestToken(w1), %d copies at once: none answered (%v)", copies, dupErrs[0])
	}
	for i := range copies {
		if dupErrs[i] != nil && stock.CodeOf(dupErrs[i]) != stock.CodeShardUnavailable {
			t.Fatalf("RequestToken(w1), copy %d of %d at once = %v", i, copies, dupErrs[i])
		}
		if dupErrs[i] == nil && (dups[i].Ticket.State != stock.TicketWaiting || dups[i].Ticket.ID != first.ID) {
			t.Errorf("RequestToken(w1), copy %d of %d at once = %+v; want the one ticket WAITING %+v", i, copies, dups[i].Ticket, first)
		}
	}

	// The next requests wait, in order.
	var waiting []*stock.Ticket
	for i, key := range []string{"w1", "w2"} {
		ans, err := request(key, 1)
		if err != nil || ans.Ticket.State != stock.TicketWaiting || ans.Ticket.Position != int64(i) || ans.Ticket.ID == "" {
			t.Fatalf("RequestToken(%s) with every unit held = %+v, %v; want WAITING at %d", key, ans.Ticket, err, i)
		}
		waiting = append(waiting, ans.Ticket)
	}
	// Behind the waitlist, a direct token's retry still answers its token:
	// entered as a ticket it would wait for a second turn.
	if again, err := request("k2", 2); err != nil || !again.Replayed || again.Ticket.TokenID != k2.Ticket.TokenID || again.Ticket.ID != "" {
		t.Errorf("RequestToken(k2) again behind a waitlist = %+v, %v; want its token %s, replayed", again.Ticket, err, k2.Ticket.TokenID)
	}
	if _, err := request("k2", 1); stock.CodeOf(err) != stock.CodeIdempotencyKeyReused {
		t.Errorf("RequestToken(k2, 1 unit) behind a waitlist = %v, want IDEMPOTENCY_KEY_REUSED", err)
	}
	if n := rows(); n != 2 {
		t.Errorf("%d ticket rows with two waiting, want 2", n)
	}

	// A unit comes back: it goes to the oldest ticket, not to a new
	// request; the ticket's reserve is under its request's key.
	if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: k1.Ticket.TokenID, Reason: "test"}); res.Err != nil {
		t.Fatalf("release k1's token: %v", res.Err)
	}
	late, err := request("late", 1)
	if err != nil || late.Ticket.State != stock.TicketWaiting {
		t.Errorf("RequestToken(late) as a unit came back to a waitlist = %+v, %v; want WAITING", late.Ticket, err)
	}
	var w1 *stock.Ticket
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		w1, err = side.svc.GetTicket(ctx, waiting[0].ID, "", "")
		if err == nil && w1.State == stock.TicketAdmitted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetTicket(w1) = %+v, %v; want ADMITTED within 5 s of a release", w1, err)
		}
	}
	held("w1", "w1", w1.TokenID)
	if again, err := request("w1", 1); err != nil || !again.Replayed || again.Ticket.ID != w1.ID || again.Ticket.TokenID != w1.TokenID {
		t.Errorf("RequestToken(w1) again = %+v, %v; want its ticket %s with token %s", again.Ticket, err, w1.ID, w1.TokenID)
	}
	if w2, err := side.svc.GetTicket(ctx, waiting[1].ID, "", ""); err != nil || w2.State != stock.TicketWaiting || w2.Position != 0 {
		t.Errorf("GetTicket(w2) = %+v, %v; want WAITING at the head", w2, err)
	}
	s.balanced(sku)
}

// TestAdmission_DirectTrustLapses: a process that read a SKU never
// ticketed trusts that read for stock.DirectTrustMax only. Process P
// grants a token directly (its read is trusted); process Q sells the
// second unit and enters the SKU's first ticket; a unit comes back. P's
// next request must read again and wait behind Q's ticket, not take the
// unit directly on its old read (seen failing with trust that never
// lapsed: a token). Then the SKU's tokens_per_customer is set: a retry of
// P's direct token still answers that token, not a ticket (seen failing
// with the lookup only for requests that may go direct: a waiting ticket).
func TestAdmission_DirectTrustLapses(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const sku = "direct-lapse"
	ad := stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: time.Minute, WaitlistMax: 10}
	s.createAdmissionSKU(sku, 1, 2, ad)
	// No workers: the waitlist moves only as the test says.
	pa, qa := s.newAllocator(), s.newAllocator()
	p := s.newAdmissionWith("lapse-p", pa, nil, nil)
	q := s.newAdmissionWith("lapse-q", qa, nil, nil)
	request := func(side *admissionSide, key string) (admission.Answer, error) {
		return side.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: key, CustomerRef: "cust-" + key})
	}
	pk, err := request(p, "p-1")
	if err != nil || pk.Ticket.ID != "" || pk.Ticket.State != stock.TicketAdmitted {
		t.Fatalf("RequestToken(p-1) at P = %+v, %v; want a token granted directly", pk.Ticket, err)
	}
	qk, err := request(q, "q-1")
	if err != nil || qk.Ticket.ID != "" || qk.Ticket.State != stock.TicketAdmitted {
		t.Fatalf("RequestToken(q-1) at Q = %+v, %v; want a token granted directly", qk.Ticket, err)
	}
	w, err := request(q, "q-2")
	if err != nil || w.Ticket.State != stock.TicketWaiting {
		t.Fatalf("RequestToken(q-2) at Q with every unit held = %+v, %v; want WAITING", w.Ticket, err)
	}
	if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: qk.Ticket.TokenID, Reason: "test"}); res.Err != nil {
		t.Fatalf("release q-1's token: %v", res.Err)
	}
	late, err := request(p, "p-2")
	if err != nil || late.Ticket.State != stock.TicketWaiting || late.Ticket.Position != 1 {
		t.Errorf("RequestToken(p-2) at P, a unit free behind Q's waiting ticket = %+v, %v; want WAITING behind it", late.Ticket, err)
	}

	ad.TokensPerCustomer = 1
	for _, a := range []*allocator.Allocator{pa, qa} {
		if _, err := a.UpdateSKU(ctx, sku, stock.SKUUpdate{Admission: &ad}); err != nil {
			t.Fatalf("UpdateSKU(tokens_per_customer 1) = %v", err)
		}
	}
	for _, side := range []*admissionSide{p, q} {
		again, err := request(side, "p-1")
		if err != nil || !again.Replayed || again.Ticket.TokenID != pk.Ticket.TokenID || again.Ticket.ID != "" {
			t.Errorf("RequestToken(p-1) again once the SKU has tokens_per_customer = %+v, %v; want its token %s, replayed", again.Ticket, err, pk.Ticket.TokenID)
		}
	}
	// And once it sells by draw: a registration of that key answers the
	// token too, and registers nothing.
	draw := stock.Admission{Mode: stock.AdmissionDraw, TokenTTL: time.Minute, WaitlistMax: 10, DrawAt: time.Now().Add(time.Hour)}
	for _, a := range []*allocator.Allocator{pa, qa} {
		if _, err := a.UpdateSKU(ctx, sku, stock.SKUUpdate{Admission: &draw}); err != nil {
			t.Fatalf("UpdateSKU(draw) = %v", err)
		}
	}
	again, err := request(p, "p-1")
	if err != nil || !again.Replayed || again.Ticket.TokenID != pk.Ticket.TokenID || again.Ticket.ID != "" {
		t.Errorf("RequestToken(p-1) again once the SKU sells by draw = %+v, %v; want its token %s, replayed", again.Ticket, err, pk.Ticket.TokenID)
	}
}

// TestAdmission_DirectCopyInBatch: a request whose direct grant found no
// unit free enters as a ticket; if a copy of it (the same key, sent at
// once) still asking for a direct grant goes first in the same entry
// batch, the batch answers both with the copy's direct grant, and the
// request that meant to enter is answered SHARD_UNAVAILABLE (retry with
// the same key: it finds the copy's ticket). The race is ordered with
// admission's test hooks: the request (A) stops before it enters again, an
// entry batch of another key is held while the copy (B) and then A queue
// behind it, and the next batch is [B, A]. Seen failing with that answer
// taken out: A read the copy's direct answer as a ticket, a nil pointer
// (a panic).
func TestAdmission_DirectCopyInBatch(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const sku = "copyinbatch"
	s.createAdmissionSKU(sku, 1, 1, stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: time.Minute, WaitlistMax: 10})
	aStopped, releaseA := make(chan struct{}), make(chan struct{})
	gate := make(chan struct{})
	var hold atomic.Bool
	queued := make(chan string, 64)
	batches := make(chan []string, 64)
	side := s.newAdmission("copy", s.alloc, func(svc *admission.Service) {
		var once sync.Once
		svc.BeforeReenter = func(key string) {
			if key == "dup" {
				once.Do(func() { close(aStopped); <-releaseA })
			}
		}
		svc.EntryQueued = func(_, key string, direct bool) { queued <- fmt.Sprintf("%s/%v", key, direct) }
		svc.EntryBatch = func(_ string, keys []string) {
			batches <- keys
			if hold.CompareAndSwap(true, false) {
				<-gate
			}
		}
	})
	request := func(key string) (admission.Answer, error) {
		return side.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: key, CustomerRef: "cust-" + key})
	}
	await := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not within 10 s", what)
		}
	}
	awaitQueued := func(want string) {
		t.Helper()
		for deadline := time.After(10 * time.Second); ; {
			select {
			case got := <-queued:
				if got == want {
					return
				}
			case <-deadline:
				t.Fatalf("no entry %s queued within 10 s", want)
			}
		}
	}
	awaitBatch := func(want []string) {
		t.Helper()
		for deadline := time.After(10 * time.Second); ; {
			select {
			case got := <-batches:
				if len(got) >= len(want) && slices.Equal(got[:len(want)], want) {
					return
				}
			case <-deadline:
				t.Fatalf("no entry batch starting %v within 10 s", want)
			}
		}
	}
	type answer struct {
		a   admission.Answer
		err error
	}
	answers := func(key string) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			a, err := request(key)
			ch <- answer{a, err}
		}()
		return ch
	}

	// The one unit, held by a token granted directly.
	if k1, err := request("k1"); err != nil || !k1.Ticket.Direct || k1.Ticket.TokenID == "" {
		t.Fatalf("RequestToken(k1) = %+v, %v; want a token granted directly", k1.Ticket, err)
	}
	// A finds no unit free and stops before it enters as a ticket.
	a := answers("dup")
	await("A stopped before entering again", aStopped)
	// An entry batch of another key is held; B, a copy of A still asking
	// directly, and then A queue behind it.
	hold.Store(true)
	x := answers("x")
	awaitBatch([]string{"x"})
	b := answers("dup")
	awaitQueued("dup/true")
	close(releaseA)
	awaitQueued("dup/false")
	close(gate)
	awaitBatch([]string{"dup", "dup"})

	got := <-a
	if stock.CodeOf(got.err) != stock.CodeShardUnavailable {
		t.Fatalf("RequestToken(dup) entering behind its copy's direct ask in one batch = %+v, %v; want SHARD_UNAVAILABLE", got.a.Ticket, got.err)
	}
	gotB := <-b
	if gotB.err != nil || gotB.a.Ticket.State != stock.TicketWaiting || gotB.a.Ticket.ID == "" {
		t.Fatalf("RequestToken(dup), the copy = %+v, %v; want a ticket WAITING", gotB.a.Ticket, gotB.err)
	}
	if gotX := <-x; gotX.err != nil || gotX.a.Ticket.State != stock.TicketWaiting {
		t.Errorf("RequestToken(x) = %+v, %v; want a ticket WAITING", gotX.a.Ticket, gotX.err)
	}
	// A's retry, as its answer says, finds the copy's ticket.
	if again, err := request("dup"); err != nil || !again.Replayed || again.Ticket.ID != gotB.a.Ticket.ID {
		t.Errorf("RequestToken(dup) again = %+v, %v; want the copy's ticket %s, replayed", again.Ticket, err, gotB.a.Ticket.ID)
	}
	s.balanced(sku)
}
