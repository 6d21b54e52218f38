package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestDB_AdmissionLockWaitersLeaveConnections: an entry batch holds its
// SKU's admission lock and reads the stock on a second connection of the
// same pool while more ticket calls of the SKU than the pool has
// connections wait for that lock. The read must get its connection: the
// waiters queue for one of the pool's lock places without holding a
// connection. Were they each holding one (a pool of 4: the holder and
// three waiters), the read would wait until its deadline, and every ticket
// of the SKU with it.
func TestDB_AdmissionLockWaitersLeaveConnections(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, pgtest.NewMigratedDB(t), postgres.Options{MaxConns: 4, ApplicationName: "lock-waiters"})
	const sku = "lock-waiters"
	entry := func(key string) []stock.TicketEntry {
		return []stock.TicketEntry{{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key}, Params: []byte(key)}}
	}
	plenty := func(context.Context) (int64, bool, error) { return 10, false, nil }
	first, err := db.EnterTickets(ctx, sku, entry("first"), 10, 0, plenty, nil)
	if err != nil || first[0].Err != nil {
		t.Fatalf("EnterTickets(first) = %v, %v", first, err)
	}
	id := first[0].Ticket.ID

	const waiters = 3 // with the holder, the whole pool
	var wg sync.WaitGroup
	defer wg.Wait()
	read := func(ctx context.Context) (int64, bool, error) {
		// Under the lock: the waiters queue behind it, then the stock is
		// read as Availability would, on the pool.
		for range waiters {
			wg.Go(func() { db.CancelTicket(ctx, id) })
		}
		time.Sleep(500 * time.Millisecond)
		readCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := db.WaitingCount(readCtx, sku); err != nil {
			return 0, false, err
		}
		return 10, false, nil
	}
	began := time.Now()
	got, err := db.EnterTickets(ctx, sku, entry("second"), 10, 0, read, nil)
	if err != nil || got[0].Err != nil {
		t.Fatalf("EnterTickets(second) with %d calls waiting for the lock = %v, %v after %v; want a ticket: the stock read found no connection",
			waiters, got, err, time.Since(began).Round(time.Millisecond))
	}
}

// TestDB_TicketReadsProbeIndexes: an entry batch reads its keys' tickets
// and its customers' counts with one index probe a key or customer, not a
// scan of the SKU's tickets, even in the generic plan of a table that grew
// from empty (a drop's: no statistics yet); and the admission worker's
// list of SKUs with open tickets reads the open tickets only. The SKU has
// ticketsN tickets, half of them ended (cancelled); each read asks for
// probesN keys or customers, half of them recorded. A plan that reads a
// ticket it does not return (removed by a filter) fails.
func TestDB_TicketReadsProbeIndexes(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewMigratedDB(t)
	db := openWith(t, url, postgres.Options{MaxConns: 4, ApplicationName: "probe-indexes"})
	const (
		sku      = "probe-indexes"
		ticketsN = 2000
		batchLen = 250
		probesN  = 100
	)
	none := func(context.Context) (int64, bool, error) { return 0, false, nil } // every ticket waits
	for b := 0; b < ticketsN/batchLen; b++ {
		entries := make([]stock.TicketEntry, batchLen)
		for i := range entries {
			n := b*batchLen + i
			key := fmt.Sprintf("key-%d", n)
			entries[i] = stock.TicketEntry{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key, CustomerRef: fmt.Sprintf("c-%d", n)},
				Params: []byte(key)}
		}
		got, err := db.EnterTickets(ctx, sku, entries, ticketsN, 5, none, nil)
		if err != nil || got[0].Err != nil {
			t.Fatalf("EnterTickets(batch %d) = %v, %v", b, got[0], err)
		}
	}
	conn := connect(t, url)
	// The odd-numbered half ended (the probes below ask for even numbers).
	if _, err := conn.Exec(ctx, `UPDATE admission_tickets SET state = 'cancelled' WHERE sku = $1 AND substr(idempotency_key, 5)::int % 2 = 1`, sku); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	probes := func(prefix string) []string {
		out := make([]string, probesN)
		for i := range out {
			out[i] = fmt.Sprintf("%s-%d", prefix, i*ticketsN/probesN*2) // every other one past ticketsN: not recorded
		}
		return out
	}
	for _, c := range []struct {
		name, sql string
		args      []string
		found     int
	}{
		{"TicketsByKey", postgres.SQLTicketsByKey, probes("key"), probesN / 2},
		{"CustomerHolds", postgres.SQLCustomerHolds, probes("c"), probesN / 2},
		{"OpenTicketSKUs", postgres.SQLOpenTicketSKUs, nil, ticketsN / 2},
		// A worker's pass: the first probesN of the open tickets.
		{"OpenTickets", postgres.SQLOpenTickets, nil, probesN},
	} {
		t.Run(c.name, func(t *testing.T) {
			// EXPLAIN takes no parameters: the arguments are literals (the
			// keys and customers have no quote or comma).
			params, explain := "(text, text[])", fmt.Sprintf(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe('%s', '{%s}')`, sku, strings.Join(c.args, ","))
			switch c.name {
			case "OpenTicketSKUs":
				params, explain = "(int)", `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe(1000)`
			case "OpenTickets":
				params, explain = "(text, text, int)", fmt.Sprintf(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe('%s', '10s', %d)`, sku, probesN)
			}
			if _, err := conn.Exec(ctx, `PREPARE probe`+params+` AS `+c.sql); err != nil {
				t.Fatal(err)
			}
			defer conn.Exec(ctx, `DEALLOCATE probe`)
			var plan []map[string]any
			if err := conn.QueryRow(ctx, explain).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			read, removed := planRows(plan[0]["Plan"].(map[string]any))
			if removed > 0 || read > float64(c.found) {
				t.Errorf("%s among %d tickets: read %.0f tickets, %.0f of them removed by a filter; want at most the %d it needs, none removed (a scan, not probes)",
					c.name, ticketsN, read, removed, c.found)
			}
		})
	}
}

// planRows sums, over an EXPLAIN (ANALYZE, FORMAT JSON) plan's nodes that
// read a table, the rows they returned and the rows their filters
// removed, times their loops.
func planRows(node map[string]any) (read, removed float64) {
	loops, _ := node["Actual Loops"].(float64)
	if _, ok := node["Relation Name"]; ok {
		rows, _ := node["Actual Rows"].(float64)
		gone, _ := node["Rows Removed by Filter"].(float64)
		recheck, _ := node["Rows Removed by Index Recheck"].(float64)
		read, removed = rows*loops, (gone+recheck)*loops
	}
	kids, _ := node["Plans"].([]any)
	for _, k := range kids {
		r, g := planRows(k.(map[string]any))
		read, removed = read+r, removed+g
	}
	return read, removed
}

// TestDB_GetTicketsPositions: GetTickets, the watches' one read, answers
// every ticket as GetTicket does, position included: waiting, claimed
// (queued but PENDING), ended and never-waited tickets of a SKU in order
// of arrival, and of a drawn SKU in draw order; a ticket not found is
// left out.
func TestDB_GetTicketsPositions(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewMigratedDB(t)
	db := openWith(t, url, postgres.Options{MaxConns: 4, ApplicationName: "get-tickets"})
	conn := connect(t, url)
	const ticketsN = 60
	none := func(context.Context) (int64, bool, error) { return 0, false, nil } // every ticket waits
	enter := func(sku string) []string {
		entries := make([]stock.TicketEntry, ticketsN)
		for i := range entries {
			// A customer each: a drawn SKU has one ticket a customer.
			key := fmt.Sprintf("key-%d", i)
			entries[i] = stock.TicketEntry{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key, CustomerRef: key}, Params: []byte(key)}
		}
		got, err := db.EnterTickets(ctx, sku, entries, ticketsN, 0, none, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]string, len(got))
		for i, e := range got {
			if e.Err != nil || e.Ticket.State != stock.TicketWaiting {
				t.Fatalf("EnterTickets(%s)[%d] = %+v, want WAITING", sku, i, e)
			}
			ids[i] = e.Ticket.ID
		}
		return ids
	}
	set := func(sql string, args ...any) {
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	arrival, drawn := enter("get-tickets"), enter("get-tickets-drawn")
	// Every third ended, every seventh claimed by a worker (queued, PENDING).
	for i, id := range arrival {
		switch {
		case i%3 == 0:
			set(`UPDATE admission_tickets SET state = 'cancelled' WHERE ticket_id = $1`, id)
		case i%7 == 0:
			set(`UPDATE admission_tickets SET state = 'pending', claimed_at = now() WHERE ticket_id = $1`, id)
		}
	}
	// The drawn SKU's ranks run against arrival (the last ticket drew 1);
	// every fourth ended.
	for i, id := range drawn {
		set(`UPDATE admission_tickets SET draw_rank = $2 WHERE ticket_id = $1`, id, ticketsN-i)
		if i%4 == 1 {
			set(`UPDATE admission_tickets SET state = 'admitted' WHERE ticket_id = $1`, id)
		}
	}
	ids := append(append([]string{"tkt_none"}, arrival...), drawn...)
	got, err := db.GetTickets(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*stock.Ticket{}
	for _, g := range got {
		byID[g.ID] = g
	}
	if len(got) != len(ids)-1 || byID["tkt_none"] != nil {
		t.Fatalf("GetTickets of %d tickets and one unknown = %d tickets, want %d", len(ids)-1, len(got), len(ids)-1)
	}
	waiting := 0
	for _, id := range ids[1:] {
		want, err := db.GetTicket(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if g := byID[id]; g.State != want.State || g.Position != want.Position || g.Rank != want.Rank || g.Seq != want.Seq {
			t.Errorf("GetTickets: %s %s rank %d position %d; GetTicket: %s rank %d position %d", id, g.State, g.Rank, g.Position, want.State, want.Rank, want.Position)
		}
		if want.State == stock.TicketWaiting && want.Position > 0 {
			waiting++
		}
	}
	// Replays of a batch of keys: each answered with its position too.
	replays := make([]stock.TicketEntry, ticketsN)
	for i := range replays {
		key := fmt.Sprintf("key-%d", i)
		replays[i] = stock.TicketEntry{Ticket: stock.Ticket{SKU: "get-tickets", Quantity: 1, IdempotencyKey: key, CustomerRef: key}, Params: []byte(key)}
	}
	again, err := db.EnterTickets(ctx, "get-tickets", replays, ticketsN, 0, none, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range again {
		if e.Err != nil || !e.Replayed || e.Ticket.ID != arrival[i] {
			t.Fatalf("EnterTickets again [%d] = %+v, want ticket %s replayed", i, e, arrival[i])
		}
		if want := byID[e.Ticket.ID]; e.Ticket.State != want.State || e.Ticket.Position != want.Position {
			t.Errorf("replay of %s: %s position %d; GetTickets: %s position %d", e.Ticket.ID, e.Ticket.State, e.Ticket.Position, want.State, want.Position)
		}
	}
	if waiting < ticketsN { // both SKUs' waiting tickets but their first
		t.Fatalf("%d tickets waiting behind others, want at least %d: the case checks too little", waiting, ticketsN)
	}
}

// TestDB_AdmissionCountsKept: the counts an entry batch, a worker's pass
// and the waitlist's length read (admission_counts, kept by the tickets'
// statements) equal a count of the tickets after every kind of change,
// made at once by several callers on three SKUs: entries (pending and
// waiting), waits, claims, admitted marks of several SKUs in one
// statement, cancels, drops, sold-out tickets and a whole waitlist sold
// out.
func TestDB_AdmissionCountsKept(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewMigratedDB(t)
	db := openWith(t, url, postgres.Options{MaxConns: 8, ApplicationName: "counts-kept"})
	skus := []string{"counts-a", "counts-b", "counts-c"}
	const (
		callersPerSKU, rounds, batchLen = 2, 15, 8
		waitlistMax                     = 40
	)
	var mu sync.Mutex
	var toMark []stock.TicketMark // admitted at once, of every SKU, by the marker
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for c := range len(skus) * callersPerSKU {
		sku := skus[c%len(skus)]
		wg.Go(func() {
			for r := range rounds {
				entries := make([]stock.TicketEntry, batchLen)
				for i := range entries {
					key := fmt.Sprintf("c%d-r%d-%d", c, r, i)
					entries[i] = stock.TicketEntry{Ticket: stock.Ticket{SKU: sku, Quantity: int64(1 + i%3), IdempotencyKey: key}, Params: []byte(key)}
				}
				units := int64(r%4) * 6 // none, or enough for some or every entry
				got, err := db.EnterTickets(ctx, sku, entries, waitlistMax, 0, func(context.Context) (int64, bool, error) { return units, false, nil }, nil)
				if err != nil {
					fail(err)
					return
				}
				var waiting []string
				for i, e := range got {
					if e.Err != nil {
						continue
					}
					id := e.Ticket.ID
					switch {
					case e.Ticket.State == stock.TicketWaiting:
						waiting = append(waiting, id)
					case i%4 == 0: // a request that found no unit after all
						w, err := db.WaitTicket(ctx, id, waitlistMax)
						switch {
						case err == nil && w.State == stock.TicketWaiting:
							waiting = append(waiting, id)
						case err != nil && stock.CodeOf(err) != stock.CodeWaitlistFull:
							fail(err)
						}
					case i%4 == 1: // refused for good
						if err := db.DropTicket(ctx, id); err != nil {
							fail(err)
						}
					case i%4 == 2:
						if _, err := db.SoldOutTicket(ctx, id); err != nil {
							fail(err)
						}
					default: // its reserve went through: marked by the marker
						mu.Lock()
						toMark = append(toMark, stock.TicketMark{ID: id, TokenID: "tok-" + id, ExpiresAt: time.Now().Add(time.Hour), Direct: true})
						mu.Unlock()
					}
				}
				for i, id := range waiting {
					switch {
					case r == rounds-1 && i%3 == 2: // left waiting
					case i%2 == 0:
						if _, err := db.CancelTicket(ctx, id); err != nil {
							fail(err)
						}
					default: // a worker claims it, then its mark
						claimed, err := db.ClaimTickets(ctx, []string{id})
						if err != nil {
							fail(err)
						}
						mu.Lock()
						for _, id := range claimed {
							toMark = append(toMark, stock.TicketMark{ID: id, TokenID: "tok-" + id, ExpiresAt: time.Now().Add(time.Hour)})
						}
						mu.Unlock()
					}
				}
			}
		})
	}
	// The marker: the marks of the moment, of every SKU, in one statement.
	done := make(chan struct{})
	marked := make(chan struct{})
	go func() {
		defer close(marked)
		for {
			mu.Lock()
			marks := toMark
			toMark = nil
			mu.Unlock()
			if len(marks) > 0 {
				if _, err := db.AdmitTickets(ctx, marks); err != nil {
					fail(err)
				}
				continue
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	wg.Wait()
	close(done)
	<-marked
	if len(toMark) > 0 {
		if _, err := db.AdmitTickets(ctx, toMark); err != nil {
			t.Fatal(err)
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Requests whose reserves are in flight: a SKU of its own, where no
	// ticket waits.
	inFlight := make([]stock.TicketEntry, batchLen)
	for i := range inFlight {
		key := fmt.Sprintf("flight-%d", i)
		inFlight[i] = stock.TicketEntry{Ticket: stock.Ticket{SKU: "counts-d", Quantity: 2, IdempotencyKey: key}, Params: []byte(key)}
	}
	if _, err := db.EnterTickets(ctx, "counts-d", inFlight, waitlistMax, 0, func(context.Context) (int64, bool, error) { return 100, false, nil }, nil); err != nil {
		t.Fatal(err)
	}
	skus = append(skus, "counts-d")
	conn := connect(t, url)
	agree := func(when string) (queuedAll, inFlightAll int64) {
		t.Helper()
		for _, sku := range skus {
			var queued, inFlight, kept, keptInFlight int64
			if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'waiting' OR state = 'pending' AND claimed_at IS NOT NULL),
					coalesce(sum(quantity) FILTER (WHERE state = 'pending' AND claimed_at IS NULL), 0)::bigint
				FROM admission_tickets WHERE sku = $1`, sku).Scan(&queued, &inFlight); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, `SELECT coalesce(sum(queued), 0)::bigint, coalesce(sum(in_flight), 0)::bigint FROM admission_counts WHERE sku = $1`,
				sku).Scan(&kept, &keptInFlight); err != nil {
				t.Fatal(err)
			}
			if kept != queued || keptInFlight != inFlight {
				t.Errorf("%s, %s: admission_counts say %d queued, %d units in flight; the tickets: %d, %d", when, sku, kept, keptInFlight, queued, inFlight)
			}
			queuedAll, inFlightAll = queuedAll+queued, inFlightAll+inFlight
		}
		return queuedAll, inFlightAll
	}
	if queued, inFlight := agree("after the callers"); queued == 0 || inFlight == 0 {
		t.Fatalf("%d tickets left queued, %d units in flight: the case checks too little", queued, inFlight)
	}
	if _, err := db.SoldOutWaiting(ctx, skus[0], 0); err != nil {
		t.Fatal(err)
	}
	agree("after a waitlist sold out")
}

// BenchmarkEnterTickets: an entry batch of enterBenchLen new keys, every
// one waiting (no unit free), behind a waitlist of waiting tickets of the
// SKU; the Postgres backends' CPU per batch from /proc (the server must be
// local). docs/benchmarks.md.
func BenchmarkEnterTickets(b *testing.B) {
	const enterBenchLen, fill = 16, 250
	none := func(context.Context) (int64, bool, error) { return 0, false, nil }
	for _, waiting := range []int{0, 5000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			ctx := context.Background()
			url := pgtest.NewMigratedDB(b)
			db := openWith(b, url, postgres.Options{MaxConns: 4, ApplicationName: "enter-bench"})
			sku := "enter-bench"
			batch := func(prefix string, n int) {
				entries := make([]stock.TicketEntry, n)
				for i := range entries {
					key := fmt.Sprintf("%s-%d", prefix, i)
					entries[i] = stock.TicketEntry{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key}, Params: []byte(key)}
				}
				got, err := db.EnterTickets(ctx, sku, entries, 1_000_000, 0, none, nil)
				if err != nil || got[0].Err != nil || got[0].Ticket.State != stock.TicketWaiting {
					b.Fatalf("EnterTickets = %+v, %v", got[0], err)
				}
			}
			for f := range waiting / fill {
				batch(fmt.Sprintf("fill-%d", f), fill)
			}
			conn := connect(b, url)
			pg := pgtest.BackendsCPU(b, conn)
			b.ResetTimer()
			for i := range b.N {
				batch(fmt.Sprintf("b-%d", i), enterBenchLen)
			}
			b.StopTimer()
			b.ReportMetric(float64(pgtest.BackendsCPU(b, conn)-pg)/float64(time.Microsecond)/float64(b.N), "pg-cpu-µs/op")
		})
	}
}

// TestDB_FirstTicketAfterTrust: no ticket of a SKU is visible within
// stock.DirectTrustMax of a read that found the SKU never ticketed (a
// read an allocator trusts that long, granting tokens directly without
// reading again). One process reads the SKU's counts over and over, as an
// allocator granting directly does (its route takes no ticket), and
// probes for tickets; two others enter tickets at once, the second after
// the first has set the flag. Every probe that saw a ticket ended more
// than DirectTrustMax after the last read that found the SKU never
// ticketed began. Seen failing without the wait after the flag (a ticket
// visible 4 ms after such a read), and with the flag set and waited for
// before the SKU's lock (the second process's ticket, which read the flag
// set, visible 14 and 17 ms after it).
func TestDB_FirstTicketAfterTrust(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewMigratedDB(t)
	var dbs []*postgres.DB
	for i := range 3 {
		db := openWith(t, url, postgres.Options{MaxConns: 4, ApplicationName: fmt.Sprint("first-ticket-", i)})
		dbs = append(dbs, db)
	}
	probe := connect(t, url)
	const sku = "first-ticket"
	none := func(context.Context) (int64, bool, error) { return 0, false, nil }
	var mu sync.Mutex
	var lastUnticketed, firstSeen time.Time
	var reads, unticketed int
	direct := func(_ context.Context, c stock.EntryCounts, _ []stock.TicketEntry, fresh []int, out []stock.TicketEntered) []int {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if !c.Ticketed {
			unticketed++
			lastUnticketed = c.ReadAt
		}
		for _, i := range fresh {
			out[i] = stock.TicketEntered{Direct: true}
		}
		return nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprint("direct-", i)
			e := []stock.TicketEntry{{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key}, Params: []byte(key), Direct: true}}
			if _, err := dbs[1].EnterTickets(ctx, sku, e, 10, 0, none, direct); err != nil {
				t.Errorf("EnterTickets(%s) = %v", key, err)
				return
			}
			var n int
			if err := probe.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1`, sku).Scan(&n); err != nil {
				t.Errorf("probe: %v", err)
				return
			}
			if n > 0 && firstSeen.IsZero() {
				firstSeen = time.Now()
			}
			time.Sleep(time.Millisecond)
		}
	})
	time.Sleep(50 * time.Millisecond) // reads before the flag
	enter := func(db *postgres.DB, key string) {
		got, err := db.EnterTickets(ctx, sku, []stock.TicketEntry{{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key}, Params: []byte("p")}},
			10, 0, none, nil)
		if err != nil || got[0].Err != nil || got[0].Ticket == nil {
			t.Errorf("EnterTickets(%s) = %+v, %v; want a ticket", key, got, err)
		}
	}
	flag := connect(t, url)
	var entering sync.WaitGroup
	entering.Go(func() { enter(dbs[0], "first") })
	// The second enters once the flag is set, before the first's wait ends.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var set bool
		if err := flag.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM admission_counts WHERE sku = $1)`, sku).Scan(&set); err != nil {
			t.Fatal(err)
		}
		if set {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flag was not set within 5 s")
		}
	}
	entering.Go(func() { enter(dbs[2], "second") })
	entering.Wait()
	time.Sleep(50 * time.Millisecond) // reads after them
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d reads, %d of them never ticketed; a ticket first seen %s after the last of those began", reads, unticketed, firstSeen.Sub(lastUnticketed))
	if unticketed == 0 || unticketed == reads || firstSeen.IsZero() {
		t.Fatalf("%d of %d reads found the SKU never ticketed, a ticket seen at %v: want reads before the tickets and after", unticketed, reads, firstSeen)
	}
	if gap := firstSeen.Sub(lastUnticketed); gap <= stock.DirectTrustMax {
		t.Errorf("a ticket was visible %s after a read that found the SKU never ticketed began, want more than %s", gap, stock.DirectTrustMax)
	}
}

// A SKU's first ticket commits its flag on a second connection while the
// entry's transaction holds one (flagTicketed): with a pool of one it is
// refused at once, not left waiting for itself until the deadline. A SKU
// that has had a ticket needs no flag, so a pool of one enters its next:
// seen failing with the lock's read saying no SKU has had one (every
// entry then flagged its SKU again, and waited, under the lock).
func TestDB_FirstTicketOneConnection(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	url := pgtest.NewMigratedDB(t)
	db := openWith(t, url, postgres.Options{MaxConns: 1, ApplicationName: "one-connection"})
	none := func(context.Context) (int64, bool, error) { return 0, false, nil }
	entry := func(sku, key string) []stock.TicketEntry {
		return []stock.TicketEntry{{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key}, Params: []byte(key)}}
	}
	start := time.Now()
	_, err := db.EnterTickets(context.Background(), "one", entry("one", "k"), 10, 0, none, nil)
	if err == nil || !strings.Contains(err.Error(), "second connection") || time.Since(start) > 5*time.Second {
		t.Errorf("EnterTickets with a pool of one = %v after %v, want the second connection's error at once", err, time.Since(start))
	}

	two := openWith(t, url, postgres.Options{MaxConns: 4, ApplicationName: "two-connections"})
	if got, err := two.EnterTickets(context.Background(), "ticketed", entry("ticketed", "first"), 10, 0, none, nil); err != nil || got[0].Err != nil || got[0].Ticket == nil {
		t.Fatalf("the SKU's first ticket, with a pool of four = %+v, %v", got, err)
	}
	got, err := db.EnterTickets(context.Background(), "ticketed", entry("ticketed", "next"), 10, 0, none, nil)
	if err != nil || got[0].Err != nil || got[0].Ticket == nil {
		t.Errorf("the next ticket of a SKU that has had one, with a pool of one = %+v, %v; want it entered, no flag needed", got, err)
	}
}

// TestDB_DrawRegistrationFlagsItsSKU: a draw's registration is its SKU's
// ticket like any (its mode may turn to TOKENS later), so the first flags
// the SKU as having had one; with a pool of one it is refused at once, as
// an entry is. Seen failing with the registration reading the SKU flagged
// already (no flag written; the pool of one let through).
func TestDB_DrawRegistrationFlagsItsSKU(t *testing.T) {
	t.Parallel() // its own database; no timing a neighbour could upset
	ctx := context.Background()
	url := pgtest.NewMigratedDB(t)
	ticket := func(sku, key string) stock.Ticket {
		return stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key, CustomerRef: "cust-" + key}
	}
	one := openWith(t, url, postgres.Options{MaxConns: 1, ApplicationName: "one-connection"})
	if _, _, err := one.RegisterTicket(ctx, ticket("drawn-one", "r"), []byte("r"), 10, true, nil); err == nil || !strings.Contains(err.Error(), "second connection") {
		t.Errorf("a SKU's first registration with a pool of one = %v, want the second connection's error", err)
	}
	db := openWith(t, url, postgres.Options{MaxConns: 4, ApplicationName: "draw-flag"})
	if _, _, err := db.RegisterTicket(ctx, ticket("drawn", "r"), []byte("r"), 10, true, nil); err != nil {
		t.Fatalf("RegisterTicket = %v", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if n := count(t, conn, `SELECT count(*) FROM admission_counts WHERE sku = 'drawn'`); n != 1 {
		t.Errorf("after a SKU's first registration, %d admission_counts rows of it, want 1 (its flag)", n)
	}
}
