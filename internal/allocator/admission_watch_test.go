package allocator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/proccpu"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestAdmission_WatchersShareALook: watchersN WatchTicket streams of one
// process watch the tickets of one waitlist. Each is told its position;
// when the first cancelledN tickets leave, every later stream is told its
// new position; each ends with CANCELLED when its ticket is cancelled. And
// however many watch, it costs one read of the tickets a look (watch.go):
// over a steady second the store is called at most once a look, where
// streams that each looked at their own ticket made watchersN calls a look
// (and counted the tickets before theirs in each).
func TestAdmission_WatchersShareALook(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const (
		sku                    = "watchers"
		watchersN, cancelledN  = 200, 10
		steady                 = time.Second
		looksMax               = int64(steady/(250*time.Millisecond)) + 2 // watchInterval, and a look at each end
		moveTimeout, endTimout = 10 * time.Second, 10 * time.Second
	)
	s.createAdmissionSKU(sku, 1, 1, stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: time.Hour, WaitlistMax: watchersN})
	f := s.newTokenFront()
	// The one unit in a token: every request after it waits.
	if a, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: "holder"}); err != nil || a.Ticket.State != stock.TicketAdmitted {
		t.Fatalf("RequestToken(holder) = %+v, %v; want a token", a, err)
	}
	ids := make([]string, watchersN)
	for i := range ids {
		a, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: fmt.Sprintf("w-%d", i)})
		if err != nil || a.Ticket.State != stock.TicketWaiting || a.Ticket.Position != int64(i) {
			t.Fatalf("RequestToken(w-%d) = %+v, %v; want WAITING at position %d", i, a.Ticket, err, i)
		}
		ids[i] = a.Ticket.ID
	}

	// Each stream's messages, as they come.
	var mu sync.Mutex
	seen := make([][]stock.Ticket, watchersN)
	last := func(i int) (stock.Ticket, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(seen[i]) == 0 {
			return stock.Ticket{}, 0
		}
		return seen[i][len(seen[i])-1], len(seen[i])
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ended := make([]chan error, watchersN)
	for i, id := range ids {
		ended[i] = make(chan error, 1)
		go func() {
			ended[i] <- f.svc.WatchTicket(wctx, id, func(t *stock.Ticket) error {
				mu.Lock()
				defer mu.Unlock()
				seen[i] = append(seen[i], *t)
				return nil
			})
		}()
	}
	// until waits for every stream's last message to pass ok.
	until := func(what string, timeout time.Duration, ok func(i int, t stock.Ticket) bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for i := range ids {
			for {
				got, n := last(i)
				if n > 0 && ok(i, got) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("stream %d: %d messages, last %s at position %d; want %s within %s", i, n, got.State, got.Position, what, timeout)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	until("its position", moveTimeout, func(i int, got stock.Ticket) bool {
		return got.State == stock.TicketWaiting && got.Position == int64(i)
	})

	before := f.tickets.queries.Load()
	time.Sleep(steady)
	if calls := f.tickets.queries.Load() - before; calls > looksMax {
		t.Errorf("%d streams watching for %s made %d calls of the ticket store, want at most %d: one look for all", watchersN, steady, calls, looksMax)
	}

	for _, id := range ids[:cancelledN] {
		if got, err := f.svc.CancelTicket(ctx, id, ""); err != nil || got.State != stock.TicketCancelled {
			t.Fatalf("CancelTicket(%s) = %+v, %v", id, got, err)
		}
	}
	until("the waitlist's move", moveTimeout, func(i int, got stock.Ticket) bool {
		if i < cancelledN {
			return got.State == stock.TicketCancelled
		}
		return got.State == stock.TicketWaiting && got.Position == int64(i-cancelledN)
	})
	for _, id := range ids[cancelledN:] {
		if _, err := f.svc.CancelTicket(ctx, id, ""); err != nil {
			t.Fatal(err)
		}
	}
	for i := range ids {
		select {
		case err := <-ended[i]:
			if got, _ := last(i); err != nil || got.State != stock.TicketCancelled {
				t.Errorf("stream %d ended with %v after %s, want CANCELLED as its last message", i, err, got.State)
			}
		case <-time.After(endTimout):
			t.Fatalf("stream %d did not end within %s of its ticket's cancel", i, endTimout)
		}
	}
}

// BenchmarkWatchers: watchersBenchN WatchTicket streams of one process on
// a waitlist of as many tickets, each iteration a second of watching:
// the ticket store's calls, this process's CPU (Go: the streams and their
// looks) and the CPU of the database's backends (read from /proc: the
// server must be local), per second of watching. docs/benchmarks.md.
func BenchmarkWatchers(b *testing.B) {
	const (
		sku            = "watchers"
		watchersBenchN = 2000
		settle         = 3 * time.Second // every stream's first read done
	)
	s := newStack(b, []string{"a"}, "")
	ctx := context.Background()
	s.createAdmissionSKU(sku, 1, 1, stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: time.Hour, WaitlistMax: watchersBenchN})
	f := s.newTokenFront()
	if _, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: "holder"}); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, watchersBenchN)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			a, err := f.svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: fmt.Sprintf("w-%d", i)})
			if err != nil {
				b.Error(err)
				return
			}
			ids[i] = a.Ticket.ID
		})
	}
	wg.Wait()
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, id := range ids {
		go f.svc.WatchTicket(wctx, id, func(*stock.Ticket) error { return nil })
	}
	time.Sleep(settle)
	calls, self, pg := f.tickets.queries.Load(), proccpu.Self(), pgtest.BackendsCPU(b, conn)
	b.ResetTimer()
	for range b.N {
		time.Sleep(time.Second)
	}
	b.StopTimer()
	secs := float64(b.N)
	b.ReportMetric(float64(f.tickets.queries.Load()-calls)/secs, "store-calls/s")
	b.ReportMetric(float64(proccpu.Self()-self)/float64(time.Millisecond)/secs, "go-cpu-ms/s")
	b.ReportMetric(float64(pgtest.BackendsCPU(b, conn)-pg)/float64(time.Millisecond)/secs, "pg-cpu-ms/s")
}
