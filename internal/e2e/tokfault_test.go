package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

// Bounds of the admission fault run.
const (
	tokStock     = 60  // units of the drop
	tokCustomers = 300 // one key each: five buyers a unit
	// tokArrival spaces the customers' first calls: the crowd outlasts
	// the faults (about 13 s of them), so that each lands mid-sale.
	tokArrival  = 30 * time.Millisecond
	tokTokenTTL = 3 * time.Second // abandoned tokens come back within the run
	// tokMoveLease is the allocators' etcd lease (topology's
	// leaseTTLDefault), which their admission leases share: the holder is
	// paused past it.
	tokMoveLease = 5 * time.Second
	// tokSettle bounds each ticket's life, from its request to its outcome
	// (ADMITTED, SOLD_OUT or CANCELLED): the faults hold the waitlist for
	// up to a lease and a half, the chain of expiries a few TTLs.
	tokSettle     = 45 * time.Second
	tokRunTimeout = 90 * time.Second
	tokPoll       = 150 * time.Millisecond // a customer's GetTicket while waiting
)

// tokHolderPID is the process id in an admission lease's value
// (topology.MoveLeases' holder: "allocator/HOST/PID@ADDR").
func tokHolderPID(holder string) int {
	rest, _, _ := strings.Cut(holder, "@")
	pid, _ := strconv.Atoi(rest[strings.LastIndex(rest, "/")+1:])
	return pid
}

// tokAllocators is the run's two allocators, one of which may be
// restarted: the customers call either, each retry the other.
type tokAllocators struct {
	s     *stack
	mu    sync.Mutex
	procs [2]*proc
	inv   [2]shardstockv1connect.InventoryServiceClient
	admin [2]shardstockv1connect.AdminServiceClient
	base  [2]string
}

// start starts (or restarts) allocator i, a process of the stack's.
func (a *tokAllocators) start(i int) {
	p := a.s.start(fmt.Sprintf("allocator%d", i+1), filepath.Join(bin, "allocator"), "-addr", "127.0.0.1:0",
		"-admin-token", adminToken, "-service-token", serviceToken, "-log-level", "warn", "-db-max-conns", "4")
	ready := p.waitReady(a.s.t, readiness.RoleAllocator)
	hc := transport.NewClient()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.procs[i], a.base[i] = p, ready.Addr
	a.inv[i] = shardstockv1connect.NewInventoryServiceClient(hc, ready.Addr, asService)
	a.admin[i] = shardstockv1connect.NewAdminServiceClient(hc, ready.Addr)
}

func (a *tokAllocators) client(i int) shardstockv1connect.InventoryServiceClient {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inv[i%2]
}

// byPID returns the index of the allocator whose process is pid, -1 if none.
func (a *tokAllocators) byPID(pid int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, p := range a.procs {
		if p != nil && p.cmd.Process.Pid == pid {
			return i
		}
	}
	return -1
}

// tokCustomer is one customer's recorded history: its request, what it was
// answered, and what it did with its token. Times are since the run's start.
type tokCustomer struct {
	key      string
	q        int64
	fate     stock.OpKind // what it does with a token: commit, release, or expire (abandons it)
	cancels  bool         // cancels its ticket if it waits
	ticketID string       // from a ticket answer
	outcome  v1.TicketState
	direct   bool // the token came in RequestToken's answer
	token    string
	expires  time.Duration // the token's expiresAt
	acked    time.Duration // when the token was first answered (the call's return)
	asked    time.Duration
	settled  time.Duration // when its outcome was known
	endCall  time.Duration // its commit's or release's first call
	ended    string        // "" (done), or the end's definite refusal reason (RESERVATION_EXPIRED: the token lapsed first)
}

// TestE2E_TokensUnderFaults sells a drop of 60 units under admission
// (ADMISSION_MODE_TOKENS) to 300 customers, one key each, through two
// allocators, on three shard servers and a Postgres of the test's own,
// while in turn: the holder of the SKU's admission lease (etcd
// /shardstock/admission/SKU) is killed (-9) while tickets wait, and
// restarted; a shard server is killed and restarted; Postgres is crashed
// and restarted; the lease holder is stopped (SIGSTOP) past its lease and
// continued. Customers commit, release or abandon (it expires) their
// tokens, and some cancel their tickets, so the waitlist moves throughout.
// Every call is retried with its key after an unknown outcome. Checked,
// from the recorded history, the ledger and the ticket rows: no unit
// promised twice; no ticket lost or admitted twice; every acknowledged
// token honoured; every ticket ADMITTED, SOLD_OUT or CANCELLED within
// tokSettle; the books balanced (checkTokens).
func TestE2E_TokensUnderFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), tokRunTimeout)
	defer cancel()
	pg := startCluster(ctx, t)
	const sku = "tokfault"
	s := newStackOpts(t, stackOpts{shardServers: 3, dbURL: pg.URL()})
	s.createSKU(sku, tokStock, 4, func(m *v1.CreateSkuRequest) {
		m.Admission = &v1.Admission{Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, TokenTtl: durationpb.New(tokTokenTTL), WaitlistMax: tokCustomers}
	})
	// The stack's own allocator is the first; a second beside it.
	al := &tokAllocators{s: s, procs: [2]*proc{s.allocator}, base: [2]string{s.base}}
	hc := transport.NewClient()
	al.inv[0], al.admin[0] = shardstockv1connect.NewInventoryServiceClient(hc, s.base, asService), s.admin
	al.start(1)

	etcd, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(s.etcd, ","), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	// holder returns the allocator holding sku's admission lease, -1 if
	// none does (or etcd cannot say now).
	holder := func() int {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := etcd.Get(rctx, "/shardstock/admission/"+sku)
		if err != nil || len(resp.Kvs) == 0 {
			return -1
		}
		return al.byPID(tokHolderPID(string(resp.Kvs[0].Value)))
	}

	start := time.Now()
	since := func() time.Duration { return time.Since(start) }
	var tickets atomic.Int64 // ticket answers: the waitlist has formed
	var landed []string      // what each fault found, for the log and the checks
	var pauseMoved bool
	var restarted time.Duration
	faultsDone := make(chan struct{})
	fctx, stopFaults := context.WithCancel(ctx)
	go func() {
		defer close(faultsDone)
		step := func(d time.Duration) bool { return pause(fctx, d) }
		// waitHolder waits for a lease holder (tickets are waiting: the
		// worker takes the lease only for a SKU with open tickets).
		waitHolder := func() int {
			for fctx.Err() == nil {
				if h := holder(); h >= 0 {
					return h
				}
				step(50 * time.Millisecond)
			}
			return -1
		}
		for tickets.Load() < 10 && step(50*time.Millisecond) {
		}
		h := waitHolder()
		if h < 0 {
			return
		}
		al.procs[h].stop(syscall.SIGKILL) // the worker mid-pass: claimed tickets, reserves in flight
		landed = append(landed, fmt.Sprintf("allocator%d (the lease holder) killed at %s", h+1, since().Round(time.Millisecond)))
		if !step(700 * time.Millisecond) {
			return
		}
		al.start(h)
		if !step(time.Second) {
			return
		}
		s.shards["s1"].stop(syscall.SIGKILL)
		landed = append(landed, fmt.Sprintf("s1 killed at %s", since().Round(time.Millisecond)))
		if !step(700 * time.Millisecond) {
			return
		}
		s.startShard("s1")
		if !step(time.Second) {
			return
		}
		if err := pg.Crash(); err != nil {
			t.Errorf("crash Postgres: %v", err)
			return
		}
		landed = append(landed, fmt.Sprintf("Postgres crashed at %s", since().Round(time.Millisecond)))
		step(500 * time.Millisecond)
		if err := pg.Restart(context.Background()); err != nil {
			t.Errorf("restart Postgres: %v", err)
			return
		}
		restarted = since()
		if !step(time.Second) {
			return
		}
		if h = waitHolder(); h < 0 {
			return
		}
		p := al.procs[h]
		p.cmd.Process.Signal(syscall.SIGSTOP)
		landed = append(landed, fmt.Sprintf("allocator%d (the lease holder) stopped at %s", h+1, since().Round(time.Millisecond)))
		// Past its lease: the other allocator must take the SKU's
		// admission over while this one sleeps.
		deadline := time.Now().Add(tokMoveLease + 1500*time.Millisecond)
		for time.Now().Before(deadline) && fctx.Err() == nil {
			if now := holder(); now >= 0 && now != h {
				pauseMoved = true
			}
			step(100 * time.Millisecond)
		}
		p.cmd.Process.Signal(syscall.SIGCONT)
	}()

	customers := make([]*tokCustomer, tokCustomers)
	var wg sync.WaitGroup
	for i := range customers {
		rnd := rand.New(rand.NewPCG(uint64(i), 31))
		c := &tokCustomer{key: fmt.Sprintf("%s-%03d", sku, i), q: 1, fate: stock.OpCommit, cancels: rnd.IntN(100) < 6}
		if rnd.IntN(5) == 0 {
			c.q = 2
		}
		switch r := rnd.IntN(100); {
		case r < 25:
			c.fate = stock.OpRelease
		case r < 45:
			c.fate = stock.OpExpire
		}
		customers[i] = c
		wg.Go(func() {
			if !pause(ctx, time.Duration(i)*tokArrival) {
				return
			}
			if err := c.run(ctx, al, sku, i, start, &tickets); err != nil {
				t.Errorf("customer %s: %v", c.key, err)
			}
		})
	}
	wg.Wait()
	stopFaults()
	<-faultsDone
	if t.Failed() {
		t.FailNow()
	}
	took := since()
	// The last abandoned tokens expire (the shard sweeps every 500 ms).
	for _, a := range al.procs {
		select {
		case <-a.done:
			t.Fatalf("an allocator exited: %s", a.output())
		default:
		}
	}
	view := *s
	view.inv, view.admin, view.base = al.client(1), al.admin[1], al.base[1]
	view.waitStable(startTimeout)
	deadline := time.Now().Add(tokTokenTTL + 5*time.Second)
	for view.stock(sku).Reserved > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("faults: %s; %s of load", strings.Join(landed, ", "), took.Round(time.Millisecond))
	if len(landed) != 4 || !pauseMoved || restarted == 0 {
		t.Fatalf("the faults did not all land (%d of 4; the lease moved during the pause: %v): the sale ended first?", len(landed), pauseMoved)
	}
	checkTokens(t, &view, pg.URL(), sku, customers, restarted)
}

// run is one customer: RequestToken until a definite answer (the same key
// on each retry, through the other allocator), then, for a ticket,
// GetTicket until it is no longer waiting (CancelTicket once, for a
// customer who cancels), then the token's fate.
func (c *tokCustomer) run(ctx context.Context, al *tokAllocators, sku string, i int, start time.Time, tickets *atomic.Int64) error {
	since := func() time.Duration { return time.Since(start) }
	c.asked = since()
	try := i
	var resp *v1.RequestTokenResponse
	err := untilDefinite(ctx, "RequestToken("+c.key+")", func(ctx context.Context) error {
		try++
		r, err := al.client(try).RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: sku, Quantity: c.q, IdempotencyKey: c.key}))
		if err == nil {
			resp = r.Msg
		}
		return err
	}, func(err error) bool { return reason(err) == "OUT_OF_STOCK" })
	switch {
	case reason(err) == "OUT_OF_STOCK":
		c.outcome, c.settled = v1.TicketState_TICKET_STATE_SOLD_OUT, since()
		return nil
	case err != nil:
		return err
	case resp.GetToken() != nil:
		c.direct, c.outcome = true, v1.TicketState_TICKET_STATE_ADMITTED
		c.token, c.expires, c.acked = resp.GetToken().GetTokenId(), resp.GetToken().GetExpiresAt().AsTime().Sub(start), since()
		c.settled = c.acked
		return c.end(ctx, al, try, since)
	}
	c.ticketID = resp.GetTicket().GetTicketId()
	if c.ticketID == "" {
		return fmt.Errorf("RequestToken answered neither a token nor a ticket: %v", resp)
	}
	tickets.Add(1)
	t := resp.GetTicket()
	cancelAt := c.asked + 400*time.Millisecond
	for t.GetState() == v1.TicketState_TICKET_STATE_WAITING {
		if since()-c.asked > tokSettle {
			return fmt.Errorf("ticket %s still waiting after %s", c.ticketID, tokSettle)
		}
		if !pause(ctx, tokPoll) {
			return ctx.Err()
		}
		if c.cancels && since() > cancelAt {
			c.cancels = false
			err = untilDefinite(ctx, "CancelTicket("+c.ticketID+")", func(ctx context.Context) error {
				try++
				r, err := al.client(try).CancelTicket(ctx, connect.NewRequest(&v1.CancelTicketRequest{TicketId: c.ticketID}))
				if err == nil {
					t = r.Msg.GetTicket()
				}
				return err
			}, func(error) bool { return false })
		} else {
			err = untilDefinite(ctx, "GetTicket("+c.ticketID+")", func(ctx context.Context) error {
				try++
				r, err := al.client(try).GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{TicketId: c.ticketID}))
				if err == nil {
					t = r.Msg.GetTicket()
				}
				return err
			}, func(error) bool { return false })
		}
		if err != nil {
			return err // TICKET_NOT_FOUND among them: an acknowledged ticket lost
		}
	}
	c.outcome, c.settled = t.GetState(), since()
	if c.outcome != v1.TicketState_TICKET_STATE_ADMITTED {
		return nil
	}
	c.token, c.expires, c.acked = t.GetToken().GetTokenId(), t.GetToken().GetExpiresAt().AsTime().Sub(start), since()
	if c.token == "" {
		return fmt.Errorf("ticket %s ADMITTED without a token", c.ticketID)
	}
	return c.end(ctx, al, try, since)
}

// end does with the token what the customer meant: commit or release it
// until a definite answer, or abandon it to expire.
func (c *tokCustomer) end(ctx context.Context, al *tokAllocators, try int, since func() time.Duration) error {
	if c.fate == stock.OpExpire {
		return nil
	}
	c.endCall = since()
	err := untilDefinite(ctx, fmt.Sprintf("%s(%s)", c.fate, c.token), func(ctx context.Context) error {
		try++
		if c.fate == stock.OpCommit {
			_, err := al.client(try).Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: c.token}))
			return err
		}
		r, err := al.client(try).Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: c.token, Reason: "test"}))
		if err == nil && r.Msg.GetReservation().GetState() == v1.ReservationState_RESERVATION_STATE_EXPIRED {
			// Released after it lapsed: the release reports the expiry
			// that won (docs/api.md), and the units came back then.
			c.ended = "RESERVATION_EXPIRED"
		}
		return err
	}, func(err error) bool {
		return connect.CodeOf(err) == connect.CodeFailedPrecondition || connect.CodeOf(err) == connect.CodeNotFound
	})
	if err != nil && reason(err) == "" {
		return err
	}
	if err != nil {
		c.ended = reason(err)
	}
	return nil
}

// tokTicket is one admission_tickets row.
type tokTicket struct {
	id, key, state, token string
	q                     int64
	direct                bool
}

// checkTokens checks the run: every customer's outcome within tokSettle;
// no acknowledged ticket lost, each row as its customer was answered; one
// reserve at most per request, each with the request's key (stock.TokenKey), and no reserve
// of another key; every acknowledged token honoured (its commit or
// release in the ledger, or its expiry); no unit promised twice, both from
// the ledger (per shard in order, the SKU's held and sold units never
// above its stock) and from the history (tokens the customers held at
// once, by their acknowledgements); the waitlist moved; the books
// balanced with nothing held.
func checkTokens(t *testing.T, s *stack, dbURL, sku string, customers []*tokCustomer, restarted time.Duration) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT ticket_id, idempotency_key, state, token_id, quantity, direct FROM admission_tickets WHERE sku = $1`, sku)
	if err != nil {
		t.Fatal(err)
	}
	byKey, byToken := map[string]*tokTicket{}, map[string]*tokTicket{}
	// Every reserve's key is a customer's request's (stock.TokenKey):
	// its ticket's admission, or its token granted directly with no
	// ticket (docs/admission.md, "Direct grants").
	byReserveKey := map[string]*tokCustomer{}
	for _, c := range customers {
		byReserveKey[stock.TokenKey(sku, c.key)] = c
	}
	for rows.Next() {
		var tk tokTicket
		if err := rows.Scan(&tk.id, &tk.key, &tk.state, &tk.token, &tk.q, &tk.direct); err != nil {
			t.Fatal(err)
		}
		byKey[tk.key] = &tk
		if tk.token != "" {
			if other := byToken[tk.token]; other != nil {
				t.Errorf("tickets %s and %s share the token %s", other.id, tk.id, tk.token)
			}
			byToken[tk.token] = &tk
		}
		if tk.state == "pending" || tk.state == "waiting" {
			t.Errorf("ticket %s (key %s) is still %s after the run", tk.id, tk.key, tk.state)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// The ledger: reserves by key, ends by reservation, and the SKU's
	// held and sold units after each entry, per shard in order.
	entries := s.ledger(sku)
	slices.SortFunc(entries, func(a, b *v1.LedgerEntry) int { return int(a.GetId() - b.GetId()) })
	reserves := map[string][]*v1.LedgerEntry{} // ticket key -> its reserve entries
	ends := map[string][]stock.OpKind{}        // reservation id -> its end entries
	type counts struct{ reserved, sold int64 }
	shards := map[int32]*counts{}
	var peak int64
	for _, e := range entries {
		kind := stock.OpKind(e.GetKind())
		switch kind {
		case stock.OpReserve:
			reserves[e.GetIdempotencyKey()] = append(reserves[e.GetIdempotencyKey()], e)
			if byReserveKey[e.GetIdempotencyKey()] == nil {
				t.Errorf("reserve %s (reservation %s) has no customer's request's key", e.GetIdempotencyKey(), e.GetReservationId())
			}
		case stock.OpCommit, stock.OpRelease, stock.OpExpire:
			ends[e.GetReservationId()] = append(ends[e.GetReservationId()], kind)
		}
		c := shards[e.GetShard()]
		if c == nil {
			c = &counts{e.GetReservedBefore(), e.GetSoldBefore()}
			shards[e.GetShard()] = c
		}
		if c.reserved != e.GetReservedBefore() || c.sold != e.GetSoldBefore() {
			t.Errorf("ledger entry %d of shard %d starts from reserved %d, sold %d; the one before ended at %d, %d",
				e.GetId(), e.GetShard(), e.GetReservedBefore(), e.GetSoldBefore(), c.reserved, c.sold)
		}
		if e.GetAvailableAfter() < 0 || e.GetReservedAfter() < 0 {
			t.Errorf("ledger entry %d leaves shard %d at available %d, reserved %d", e.GetId(), e.GetShard(), e.GetAvailableAfter(), e.GetReservedAfter())
		}
		c.reserved, c.sold = e.GetReservedAfter(), e.GetSoldAfter()
		var promised int64
		for _, c := range shards {
			promised += c.reserved + c.sold
		}
		if promised > tokStock {
			t.Errorf("after ledger entry %d, %d units are held or sold of %d: a unit promised twice", e.GetId(), promised, tokStock)
		}
		peak = max(peak, promised)
	}
	for key, rs := range reserves {
		if len(rs) > 1 {
			who := key
			if c := byReserveKey[key]; c != nil {
				who = c.key
			}
			t.Errorf("customer %s granted a token %d times: reserves %v", who, len(rs), rs)
		}
	}
	for id, es := range ends {
		if len(es) > 1 {
			t.Errorf("reservation %s ended %d times: %v", id, len(es), es)
		}
	}

	// Each customer against the rows and the ledger.
	var tokens, fromWaitlist, direct, soldOut, cancelled, committed, released, expired, lapsed int
	var sold int64
	var last time.Duration
	for _, c := range customers {
		tk := byKey[c.key]
		if c.settled-c.asked > tokSettle {
			t.Errorf("customer %s: outcome %s after %s, want within %s", c.key, c.outcome, c.settled-c.asked, tokSettle)
		}
		last = max(last, c.settled)
		switch c.outcome {
		case v1.TicketState_TICKET_STATE_SOLD_OUT:
			soldOut++
			if tk != nil && tk.state != "sold_out" {
				t.Errorf("customer %s was answered sold out; its ticket %s is %s", c.key, tk.id, tk.state)
			}
			continue
		case v1.TicketState_TICKET_STATE_CANCELLED:
			cancelled++
		case v1.TicketState_TICKET_STATE_ADMITTED:
			tokens++
		default:
			t.Errorf("customer %s ended %s", c.key, c.outcome)
			continue
		}
		rs := reserves[stock.TokenKey(sku, c.key)]
		if tk == nil && c.direct {
			// Granted directly, with no ticket: its reserve is its record.
			direct++
			tk = &tokTicket{key: c.key, state: "admitted", token: c.token, q: c.q, direct: true}
			if len(rs) > 0 {
				tk.token, tk.q = rs[0].GetReservationId(), rs[0].GetQuantity()
			}
		}
		if tk == nil {
			t.Errorf("customer %s was answered %s (ticket %q), and its ticket is gone: lost", c.key, c.outcome, c.ticketID)
			continue
		}
		if c.ticketID != "" && c.ticketID != tk.id {
			t.Errorf("customer %s was answered ticket %s; its key's ticket is %s", c.key, c.ticketID, tk.id)
		}
		if c.outcome == v1.TicketState_TICKET_STATE_CANCELLED {
			// A reserve of a ticket cancelled before its mark is given
			// back (or expires): counted as held nowhere else.
			if tk.state != "cancelled" || len(rs) > 0 && len(ends[rs[0].GetReservationId()]) != 1 {
				t.Errorf("customer %s cancelled ticket %s: it is %s, its reserves %v", c.key, tk.id, tk.state, rs)
			}
			continue
		}
		if !c.direct {
			fromWaitlist++
		}
		if tk.state != "admitted" || tk.token != c.token || tk.q != c.q || tk.direct != c.direct || len(rs) != 1 || rs[0].GetReservationId() != c.token || rs[0].GetQuantity() != c.q {
			t.Errorf("customer %s holds token %s of %d (direct: %v); its ticket %s is %s with token %q of %d (direct: %v), reserves %v",
				c.key, c.token, c.q, c.direct, tk.id, tk.state, tk.token, tk.q, tk.direct, rs)
			continue
		}
		// Honoured: the end the customer was answered, or the expiry of a
		// token it abandoned, or let lapse before its commit reached it.
		es := ends[c.token]
		switch {
		case c.fate == stock.OpExpire || c.ended == "RESERVATION_EXPIRED":
			if !slices.Equal(es, []stock.OpKind{stock.OpExpire}) {
				t.Errorf("customer %s's token %s (%s, answered %q) has ends %v, want an expiry", c.key, c.token, c.fate, c.ended, es)
			}
			if c.fate == stock.OpExpire {
				expired++
			} else {
				lapsed++
			}
		case c.ended != "":
			t.Errorf("customer %s's %s of token %s (acknowledged at %s, expiring at %s) refused %s", c.key, c.fate, c.token, c.acked, c.expires, c.ended)
		case !slices.Equal(es, []stock.OpKind{c.fate}):
			t.Errorf("customer %s's %s of token %s succeeded; its ends in the ledger are %v", c.key, c.fate, c.token, es)
		case c.fate == stock.OpCommit:
			committed++
			sold += c.q
		default:
			released++
		}
	}

	// The history: the units of the tokens the customers held at once,
	// each from its acknowledgement to the first call of its release, to
	// its expiry, or for good once committed (a commit that found it
	// expired: to its expiry).
	var promisedMax int64
	for _, a := range customers {
		if a.token == "" {
			continue
		}
		var held int64
		for _, b := range customers {
			if b.token == "" || b.acked > a.acked {
				continue
			}
			until := time.Duration(1 << 62)
			switch {
			case b.fate == stock.OpExpire || b.ended == "RESERVATION_EXPIRED":
				until = b.expires
			case b.fate == stock.OpRelease:
				until = b.endCall
			}
			if a.acked < until {
				held += b.q
			}
		}
		promisedMax = max(promisedMax, held)
	}
	if promisedMax > tokStock {
		t.Errorf("the customers held tokens of %d units at once, of %d: a unit promised twice", promisedMax, tokStock)
	}
	t.Logf("%d customers: %d tokens (%d from the waitlist, %d granted directly with no ticket), %d sold out, %d cancelled; tokens %d committed (%d units), %d released, "+
		"%d abandoned and expired, %d lapsed before their commit; %d ticket rows, %d ledger entries, at most %d units held or sold (ledger), "+
		"%d (history); last outcome at %s, Postgres back at %s",
		len(customers), tokens, fromWaitlist, direct, soldOut, cancelled, committed, sold, released, expired, lapsed, len(byKey), len(entries),
		peak, promisedMax, last.Round(time.Millisecond), restarted.Round(time.Millisecond))
	if fromWaitlist == 0 || expired == 0 || released == 0 || cancelled == 0 || direct == 0 {
		t.Errorf("the waitlist did not move as the run means: %d admitted from it, %d granted directly, %d expired, %d released, %d cancelled",
			fromWaitlist, direct, expired, released, cancelled)
	}
	late := 0
	for _, c := range customers {
		if c.token != "" && c.acked > restarted {
			late++
		}
	}
	if late == 0 {
		t.Errorf("no token after Postgres came back (%s): the sale ended before the faults did", restarted)
	}
	if st := s.stock(sku); st.Sold != sold || st.Reserved != 0 || st.Available+st.Sold+st.InTransit != tokStock {
		t.Errorf("stock %v: want sold %d (the committed tokens), nothing held, and conservation of %d", st, sold, tokStock)
	}
	s.reconcile(sku)
}
