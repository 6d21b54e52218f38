package allocator_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestAdmission_Draw is the draw's must-show (issue 31): 1,000 customers
// register for 100 units, holding nothing; the first worker to run the
// draw stops right after recording its seed, and the next lease holder
// draws with that seed, not a new one; GetDraw's seed and list replay
// (admission.DrawOrder) to the recorded order; exactly the first 100
// drawn are ADMITTED with tokens, the rest wait in drawn order; a released
// token goes to the next ticket drawn; once the SKU is sold out for good,
// every ticket still waiting is LOST.
func TestAdmission_Draw(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const (
		sku                  = "draw-1"
		units, registrations = 100, 1000
		parallel             = 16
		pageLen              = 300
		settleTimeout        = 10 * time.Second
	)
	ad := stock.Admission{Mode: stock.AdmissionDraw, TokenTTL: time.Minute, WaitlistMax: 2 * registrations, DrawAt: time.Now().Add(time.Hour)}
	s.createAdmissionSKU(sku, 2, units, ad)
	allocs := []*allocator.Allocator{s.newAllocator(), s.newAllocator()}
	front := s.newAdmissionWith("front", allocs[0], nil, nil) // answers requests; no worker
	customer := func(i int) string { return fmt.Sprintf("cust-%04d", i) }
	request := func(i int, key string) (admission.Answer, error) {
		return front.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: key, CustomerRef: customer(i)})
	}

	tickets := make([]*stock.Ticket, registrations)
	var wg sync.WaitGroup
	for p := range parallel {
		wg.Go(func() {
			for i := p; i < registrations; i += parallel {
				ans, err := request(i, fmt.Sprintf("k-%d", i))
				if err != nil || ans.Ticket.State != stock.TicketRegistered {
					t.Errorf("RequestToken(customer %d) = %+v, %v; want a REGISTERED ticket", i, ans.Ticket, err)
					return
				}
				tickets[i] = ans.Ticket
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if again, err := request(7, "k-7"); err != nil || !again.Replayed || again.Ticket.ID != tickets[7].ID {
		t.Fatalf("RequestToken(replay) = %+v, %v; want ticket %s replayed", again.Ticket, err, tickets[7].ID)
	}
	if _, err := request(7, "another-key"); stock.CodeOf(err) != stock.CodeCustomerLimitReached {
		t.Fatalf("RequestToken(a second key of a registered customer) = %v, want CUSTOMER_LIMIT_REACHED", err)
	}
	if st, err := s.alloc.GetStock(ctx, sku); err != nil || st.Total.Available != units {
		t.Fatalf("GetStock(%s) = %+v, %v; want all %d available during registration", sku, st.Total, err, units)
	}

	// Registration closes; the first worker stops after recording the
	// seed, every time it tries.
	var mu sync.Mutex
	var seeds [][]byte
	crashing := s.newAdmission("crashing", allocs[1], func(svc *admission.Service) {
		svc.AfterSeed = func(_ string, seed []byte) error {
			mu.Lock()
			defer mu.Unlock()
			seeds = append(seeds, slices.Clone(seed))
			return errors.New("crashed after the seed")
		}
	})
	ad.DrawAt = time.Now().Add(-time.Second)
	for _, a := range allocs {
		if _, err := a.UpdateSKU(ctx, sku, stock.SKUUpdate{Admission: &ad}); err != nil {
			t.Fatalf("UpdateSKU(draw_at now) = %v", err)
		}
	}
	waitFor(t, settleTimeout, "the seed recorded", func() bool { mu.Lock(); defer mu.Unlock(); return len(seeds) >= 2 })
	crashing.halt()
	recorded := seeds[0]
	for _, sd := range seeds {
		if !slices.Equal(sd, recorded) {
			t.Fatalf("the crashing worker drew seed %x, then %x: a retry must use the recorded seed", recorded, sd)
		}
	}
	if d, err := front.svc.GetDraw(ctx, sku, 0, 0); err != nil || d.State != stock.DrawSeeded || !slices.Equal(d.Seed, recorded) || len(d.Tickets) != 0 {
		t.Fatalf("GetDraw(after the crash) = %+v, %v; want SEEDED with seed %x and no order yet", d, err, recorded)
	}
	if _, err := request(registrations, "late"); stock.CodeOf(err) != stock.CodeSaleEnded {
		t.Fatalf("RequestToken(after draw_at) = %v, want SALE_ENDED", err)
	}

	// The next lease holder runs the draw with the recorded seed.
	taker := s.newAdmission("taker", allocs[0], nil)
	waitFor(t, settleTimeout, "the draw's winners admitted", func() bool {
		st, err := s.alloc.GetStock(ctx, sku)
		return err == nil && st.Total.Available == 0 && st.Total.Reserved == units
	})
	var order []string
	for after := int64(0); ; {
		d, err := taker.svc.GetDraw(ctx, sku, after, pageLen)
		if err != nil || d.State != stock.DrawDrawn || hex.EncodeToString(d.Seed) != hex.EncodeToString(recorded) || d.Total != registrations {
			t.Fatalf("GetDraw(%d) = %+v, %v; want DRAWN, seed %x, %d tickets", after, d, err, recorded, registrations)
		}
		order = append(order, d.Tickets...)
		after += int64(len(d.Tickets))
		if len(d.Tickets) < pageLen {
			break
		}
	}
	ids := make([]string, registrations)
	for i, tk := range tickets {
		ids[i] = tk.ID
	}
	if replay := admission.DrawOrder([admission.DrawSeedLen]byte(recorded), ids); !slices.Equal(order, replay) {
		t.Fatalf("GetDraw's order (%d tickets) is not DrawOrder(its seed, its tickets)", len(order))
	}
	state := func(id string) *stock.Ticket {
		got, err := front.svc.GetTicket(ctx, id, "", "")
		if err != nil {
			t.Fatalf("GetTicket(%s) = %v", id, err)
		}
		return got
	}
	var tokens []string
	for rank, id := range order {
		got := state(id)
		switch {
		case rank < units && (got.State != stock.TicketAdmitted || got.TokenID == "" || got.Rank != int64(rank)+1):
			t.Fatalf("drawn #%d: ticket %+v, want ADMITTED with a token", rank+1, got)
		case rank >= units && (got.State != stock.TicketWaiting || got.Position != int64(rank-units)):
			t.Fatalf("drawn #%d: ticket %+v, want WAITING at position %d", rank+1, got, rank-units)
		}
		if got.State == stock.TicketAdmitted {
			tokens = append(tokens, got.TokenID)
		}
	}

	// A winner's retry answers its ticket, admitted: its token's reserve
	// has the request's key (stock.TokenKey), but it is no direct grant.
	for i, tk := range tickets {
		if tk.ID != order[0] {
			continue
		}
		again, err := request(i, fmt.Sprintf("k-%d", i))
		if err != nil || !again.Replayed || again.Ticket.ID != order[0] || again.Ticket.State != stock.TicketAdmitted || again.Ticket.Rank != 1 {
			t.Errorf("RequestToken(the first winner's key) again = %+v, %v; want its ticket %s ADMITTED, replayed", again.Ticket, err, order[0])
		}
	}

	// A released token goes to the next ticket drawn, not any other.
	if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: tokens[0], Reason: "test"}); res.Err != nil {
		t.Fatalf("Release(%s) = %v", tokens[0], res.Err)
	}
	waitFor(t, settleTimeout, "the next ticket drawn admitted", func() bool { return state(order[units]).State == stock.TicketAdmitted })
	if got := state(order[units+1]); got.State != stock.TicketWaiting || got.Position != 0 {
		t.Fatalf("drawn #%d after one release: %+v, want WAITING first", units+2, got)
	}
	tokens = append(tokens[1:], state(order[units]).TokenID)

	// Sold out for good: every ticket still waiting is LOST.
	for _, tk := range tokens {
		if res := s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpCommit, ReservationID: tk}); res.Err != nil {
			t.Fatalf("Commit(%s) = %v", tk, res.Err)
		}
	}
	waitFor(t, settleTimeout, "the last ticket drawn LOST", func() bool { return state(order[len(order)-1]).State == stock.TicketLost })
	for _, id := range order[units+1:] {
		if got := state(id); got.State != stock.TicketLost {
			t.Fatalf("ticket %s after the sell-out: %s, want LOST", id, got.State)
		}
	}
	s.balanced(sku)
}
