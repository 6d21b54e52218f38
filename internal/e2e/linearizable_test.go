package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"

	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/faultproxy"
	"github.com/shardstock/shardstock/internal/freeport"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
)

// stockOp is one operation of the recorded history: a deduct or a reserve
// of q (ok: it succeeded; !ok: OUT_OF_STOCK), or the commit or the release
// of a reservation of q (always ok: the client retries it until it has).
type stockOp struct {
	kind stock.OpKind
	q    int64
}

// stockModel is one exact stock counter of the units available: a deduct
// or a reserve of q succeeds iff it holds at least q, and takes q; a
// refusal (OUT_OF_STOCK) leaves it; a commit leaves it (the units were
// taken by the reserve); a release gives q back, once. A key's retries are
// one operation: the client's first call to its first definite answer (a
// success, a replayed success or OUT_OF_STOCK).
func stockModel(initial int64) porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return initial },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			st, op, ok := state.(int64), input.(stockOp), output.(bool)
			switch op.kind {
			case stock.OpCommit:
				return ok, st
			case stock.OpRelease:
				return ok, st + op.q
			}
			if ok {
				return st >= op.q, st - op.q
			}
			return st < op.q, st
		},
		Equal: func(a, b interface{}) bool { return a.(int64) == b.(int64) },
		DescribeOperation: func(input, output interface{}) string {
			op := input.(stockOp)
			return fmt.Sprintf("%s(%d) -> %v", op.kind, op.q, output.(bool))
		},
	}
}

// Bounds of the linearizability run.
const (
	linClients  = 24
	linOpsMax   = 700 // keys in all: about 1,400 units asked of 1,000
	linStock    = 1000
	linPause    = 200 * time.Millisecond // between one client's keys: the sale outlasts the faults
	linRetryMax = 200                    // tries of one key before the test gives up on it
	// linRetryPause is the first pause after an unknown outcome; it doubles
	// up to linRetryPauseMax (200 tries then outlast linRunTimeout).
	linRetryPause    = 50 * time.Millisecond
	linRetryPauseMax = time.Second
	linRunTimeout    = 90 * time.Second
)

// TestE2E_LinearizableUnderFaults drives deducts of 1 to 3 units on one hot
// SKU through the public API from 24 clients while faults land: a shard
// server killed (-9) and restarted, another stopped (SIGSTOP) past its
// lease and continued (the zombie must be fenced), and Postgres crashed and
// restarted; meanwhile, every 300 ms, a call to the third is cut once
// delivered, while it may still be deciding it (10 in all). The history is checked by
// checkHistory. A WatchLedger consumer, a `stockctl watch ledger` process,
// is attached throughout, SIGKILLed twice and restarted from the last
// cursor it printed: at the end it has received the ledger
// (ledgerConsumer.check).
func TestE2E_LinearizableUnderFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	pg := startCluster(ctx, t)
	const sku = "linear"
	// s3 registers the address of a fault-injecting proxy: its calls are
	// cut once delivered, while it may still be deciding them.
	var s3 *faultproxy.Proxy
	s := newStackOpts(t, stackOpts{shardServers: 2, dbURL: pg.URL(), startShards: func(s *stack) {
		s3 = startProxiedShard(t, s, "s3", "")
	}})
	s.createSKU(sku, linStock, 8)
	// A change stream consumer (a stockctl process) is attached throughout,
	// SIGKILLed twice (and restarted from its cursor each time) and cut
	// off by the Postgres crash.
	consumer, stopConsumer := attachConsumer(t, s, sku)

	var restarted atomic.Int64 // when Postgres answered again, since the run's start
	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		cutting := make(chan struct{})
		go func() {
			defer close(cutting)
			cutDelivered(ctx, s3, sku)
		}()
		defer func() { <-cutting }()
		step := func(d time.Duration) bool { return pause(ctx, d) }
		if !step(300 * time.Millisecond) {
			return
		}
		s.shards["s1"].stop(syscall.SIGKILL) // kill -9 mid-batch
		if !step(700 * time.Millisecond) {
			return
		}
		consumer.kill()
		s.startShard("s1")
		s2 := s.shards["s2"]
		s2.cmd.Process.Signal(syscall.SIGSTOP) // past its 2 s lease: a zombie
		if !step(2500 * time.Millisecond) {
			s2.cmd.Process.Signal(syscall.SIGCONT)
			return
		}
		s2.cmd.Process.Signal(syscall.SIGCONT)
		consumer.kill()
		if !step(500 * time.Millisecond) {
			return
		}
		if err := pg.Crash(); err != nil {
			t.Errorf("crash Postgres: %v", err)
			return
		}
		step(500 * time.Millisecond)
		if err := pg.Restart(context.Background()); err != nil {
			t.Errorf("restart Postgres: %v", err)
		}
		restarted.Store(since())
	})
	if s3.Cuts() < linDeliveredCutsMin {
		t.Errorf("%d calls to s3 cut once delivered, want at least %d", s3.Cuts(), linDeliveredCutsMin)
	}
	checkHistory(t, s, sku, h, restarted.Load(), fmt.Sprintf("a shard server killed, one stopped past its lease, Postgres crashed, "+
		"%d calls cut once delivered to a third", s3.Cuts()))
	consumer.check(t, stopConsumer, 2)
}

// Delivered cuts in TestE2E_LinearizableUnderFaults: at least
// linDeliveredCutsMin for the run to count, and no more than
// linDeliveredCutsMax, so that the server's breaker, once the cuts open it,
// closes again: a cut always armed would catch its lone probe each time.
const (
	linDeliveredCutsMin = 5
	linDeliveredCutsMax = 10
)

// cutDelivered arms p, every linCutEvery until ctx ends or
// linDeliveredCutsMax cuts landed, to cut the next call of sku once
// delivered (faultproxy.CutDelivered): the shard server has it, and may
// still be deciding it, when the allocator's call fails.
func cutDelivered(ctx context.Context, p *faultproxy.Proxy, sku string) {
	tick := time.NewTicker(linCutEvery)
	defer tick.Stop()
	defer p.Disarm()
	for p.Cuts() < linDeliveredCutsMax {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p.Disarm() // a cut lasts one tick (see TestE2E_LinkFaultsUnderLoad)
		p.Arm([]byte(sku), faultproxy.CutDelivered)
	}
}

// linCutEvery is the pause between two delivered cuts.
const linCutEvery = 300 * time.Millisecond

// startProxiedShard starts shard server id behind a fault-injecting proxy,
// whose address it registers (-advertise), with dbURL as its DATABASE_URL
// ("": the stack's).
func startProxiedShard(t *testing.T, s *stack, id, dbURL string) *faultproxy.Proxy {
	t.Helper()
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var env []string
	if dbURL != "" {
		env = []string{"DATABASE_URL=" + dbURL}
	}
	s.shards[id] = s.startEnv(id, env, filepath.Join(bin, "shard"),
		"-id", id, "-addr", fmt.Sprintf("127.0.0.1:%d", port),
		"-advertise", p.Addr(), "-lease-ttl", s.leaseTTL.String(), "-db-max-conns", "8", "-log-level", "warn")
	return p
}

// TestE2E_LinkFaultsUnderLoad puts fault-injecting TCP proxies on both
// kinds of link: between the allocator and each shard server (the address
// a shard server registers is its proxy's) and between the shard servers
// and Postgres. Through the load: every 150 ms a link to a shard server is
// cut, before a request reaches it, after it acted (losing only the
// answer), or right after it was delivered, while the server may still be
// deciding it (each cut closes the HTTP/2 connection and every call on
// it); every 600 ms a shard server's link to Postgres is cut at a COMMIT,
// before Postgres sees it or after, losing only its answer; one shard
// server's answers are slowed by 400 ms for 2 s (a slow shard server: the
// breaker opens, traffic routes around it), and another's are held for 2 s
// while requests still reach it (a one-way partition). The history is
// checked by checkHistory.
func TestE2E_LinkFaultsUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	dbURL := pgtest.NewMigratedDB(t)
	pgProxy, proxied, err := faultproxy.StartPostgres(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pgProxy.Close() })

	var proxies []*faultproxy.Proxy
	s := newStackOpts(t, stackOpts{dbURL: dbURL, startShards: func(s *stack) {
		for i := 1; i <= 3; i++ {
			proxies = append(proxies, startProxiedShard(t, s, fmt.Sprintf("s%d", i), proxied))
		}
	}})
	const sku = "linkfault"
	s.createSKU(sku, linStock, 8)

	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		rnd := rand.New(rand.NewPCG(3, 5))
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		defer func() {
			proxies[1].Heal()
			for _, p := range proxies {
				p.Disarm()
			}
			pgProxy.Disarm()
		}()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// In turn: lost before the shard server, lost after it
			// answered, and lost once delivered, the server still deciding.
			cut := []faultproxy.Cut{faultproxy.CutReply, faultproxy.CutRequest, faultproxy.CutDelivered}[i%3]
			// A cut lasts one tick: one that waited would fire on the
			// first message through its link, the breaker's lone probe of
			// a server it opened on, every time.
			for _, p := range proxies {
				p.Disarm()
			}
			// Any request of this SKU: its name is in every request's body.
			proxies[rnd.IntN(len(proxies))].Arm([]byte(sku), cut)
			if i%4 == 0 {
				pgProxy.Arm(faultproxy.Commit, []faultproxy.Cut{faultproxy.CutReply, faultproxy.CutRequest}[i/4%2])
			}
			switch i {
			case 6: // about 0.9 s in
				proxies[0].SetDelay(400 * time.Millisecond)
			case 20: // about 3 s in
				proxies[0].SetDelay(0)
				proxies[1].Partition()
			case 34: // about 5.1 s in
				proxies[1].Heal()
			}
		}
	})
	var cuts int64
	for _, p := range proxies {
		cuts += p.Cuts()
	}
	opened := func(id string) int64 {
		return s.allocatorCounter(`shardstock_allocator_breaker_transitions_total{server="` + id + `",state="open"}`)
	}
	t.Logf("breakers opened: s1 (slowed) %d times, s2 (partitioned) %d, s3 %d", opened("s1"), opened("s2"), opened("s3"))
	if opened("s1") == 0 {
		t.Error("the slowed shard server's breaker never opened")
	}
	if cuts < 5 || pgProxy.Cuts() < 3 {
		t.Errorf("%d links to shard servers and %d to Postgres cut during the load, want at least 5 and 3", cuts, pgProxy.Cuts())
	}
	checkHistory(t, s, sku, h, 0, fmt.Sprintf("%d links between the allocator and the shard servers cut, %d between the shard servers and Postgres, "+
		"one shard server slowed by 400 ms for 2 s, one partitioned one way for 2 s", cuts, pgProxy.Cuts()))
}

// history is one run's recorded operations and what was acknowledged.
type history struct {
	ops      []porcupine.Operation
	acked    map[string]stockOp // key -> its deduct or reserve, acknowledged
	refused  map[string]bool
	ended    map[string]stockOp // reservation id -> its commit or release
	reserved map[string]string  // reservation id -> its reserve's key
	took     time.Duration
	unknown  int64 // calls whose outcome was unknown (a retryable error), each retried
}

// sold returns the units the history sold: acknowledged deducts and
// committed reservations.
func (h *history) sold() int64 {
	var sold int64
	for _, op := range h.acked {
		if op.kind == stock.OpDeduct {
			sold += op.q
		}
	}
	for _, op := range h.ended {
		if op.kind == stock.OpCommit {
			sold += op.q
		}
	}
	return sold
}

// runHistory drives linOpsMax keys of 1 to 3 units of sku from linClients
// clients, half deducts and half reserves, each reservation then
// committed or released (half each); every call is retried with the same
// key (or reservation) after each unknown outcome until a definite
// answer, while faults runs (it gets the run's clock, in ns since its
// start, and ends with ctx). Each key, and each end of a reservation, is
// one operation: its first call to its first definite answer.
func runHistory(ctx context.Context, t *testing.T, s *stack, sku string, faults func(ctx context.Context, since func() int64)) *history {
	t.Helper()
	start := time.Now()
	since := func() int64 { return time.Since(start).Nanoseconds() }
	h := &history{acked: map[string]stockOp{}, refused: map[string]bool{}, ended: map[string]stockOp{}, reserved: map[string]string{}}
	var mu sync.Mutex
	record := func(client int, op stockOp, call int64, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: op, Call: call, Output: ok, Return: since()})
	}
	next := 0
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		if next >= linOpsMax {
			return -1
		}
		next++
		return next - 1
	}
	unknownBefore := unknownOutcomes.Load()
	fctx, stopFaults := context.WithCancel(ctx)
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		faults(fctx, since)
	}()
	var wg sync.WaitGroup
	for c := range linClients {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(c), 7))
			for {
				i := take()
				if i < 0 {
					return
				}
				key := fmt.Sprintf("%s-%03d", sku, i)
				op := stockOp{kind: stock.OpDeduct, q: int64(1 + rnd.IntN(3))}
				if rnd.IntN(2) == 0 {
					op.kind = stock.OpReserve
				}
				call := since()
				id, ok, err := takeUntilDefinite(ctx, s, sku, key, op)
				if err != nil {
					t.Error(err)
					return
				}
				record(c, op, call, ok)
				mu.Lock()
				if ok {
					h.acked[key] = op
				} else {
					h.refused[key] = true
				}
				if id != "" {
					h.reserved[id] = key
				}
				mu.Unlock()
				if id != "" {
					end := stockOp{kind: stock.OpCommit, q: op.q}
					if rnd.IntN(2) == 0 {
						end.kind = stock.OpRelease
					}
					call := since()
					if err := endUntilDefinite(ctx, s, id, end.kind); err != nil {
						t.Error(err)
						return
					}
					record(c, end, call, true)
					mu.Lock()
					h.ended[id] = end
					mu.Unlock()
				}
				time.Sleep(linPause)
			}
		})
	}
	wg.Wait()
	stopFaults()
	<-faultsDone
	h.took = time.Since(start)
	h.unknown = unknownOutcomes.Load() - unknownBefore
	if t.Failed() {
		t.FailNow()
	}
	s.waitStable(startTimeout)
	return h
}

// retryable reports whether err leaves a call's outcome unknown: the API
// asks the client to retry it with the same key.
func retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeAborted, connect.CodeUnknown, connect.CodeCanceled:
		return true
	}
	return false
}

// unknownOutcomes counts the calls of untilDefinite whose outcome was
// unknown (a retryable error), in this test binary.
var unknownOutcomes atomic.Int64

// untilDefinite calls send (with a 3 s deadline each time) until it
// returns nil or an error definite reports as an answer, retrying after
// every unknown outcome (a retryable code), as the API asks of clients.
// It returns send's last error: nil, or the definite one.
func untilDefinite(ctx context.Context, what string, send func(context.Context) error, definite func(error) bool) error {
	var err error
	for try := 0; try < linRetryMax && ctx.Err() == nil; try++ {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		err = send(actx)
		acancel()
		if err == nil || definite(err) {
			return err
		}
		if !retryable(err) {
			return fmt.Errorf("%s = %v: not a retryable answer", what, err)
		}
		unknownOutcomes.Add(1)
		// Backing off, as a client should: a shard server's breaker may
		// stay open for seconds while its database fails over or a cut
		// catches each probe, and fast retries would spend the tries
		// before the run's deadline (linRunTimeout) does.
		time.Sleep(min(linRetryPause<<min(try, 5), linRetryPauseMax))
	}
	return fmt.Errorf("%s had no definite answer after %d tries or %s: %v", what, linRetryMax, linRunTimeout, err)
}

// takeUntilDefinite sends a deduct or a reserve (op) with key until a
// definite answer: ok is a success (or a replayed one, or the key's
// operation found by GetOperation before a retry), !ok OUT_OF_STOCK; id is
// a reservation's id.
func takeUntilDefinite(ctx context.Context, s *stack, sku, key string, op stockOp) (id string, ok bool, err error) {
	outOfStock := func(err error) bool { return reason(err) == "OUT_OF_STOCK" }
	tries := 0
	err = untilDefinite(ctx, fmt.Sprintf("%s(%s)", op.kind, key), func(ctx context.Context) error {
		// After an unknown outcome the client first asks for the key's
		// operation, as the API offers: an operation found is an
		// acknowledgement as much as a success answered.
		if tries++; tries > 1 {
			resp, err := s.inv.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: sku, IdempotencyKey: key}))
			if err == nil {
				id = resp.Msg.GetOperation().GetReservationId()
				return nil
			}
		}
		if op.kind != stock.OpReserve {
			_, err := s.deduct(ctx, sku, key, op.q)
			return err
		}
		resp, err := s.inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: op.q, IdempotencyKey: key, Ttl: durationpb.New(time.Hour)}))
		if err == nil {
			id = resp.Msg.GetReservation().GetReservationId()
		}
		return err
	}, outOfStock)
	switch {
	case err == nil:
		return id, true, nil
	case outOfStock(err):
		return "", false, nil
	}
	return "", false, err
}

// endUntilDefinite commits or releases a reservation until it has (a
// replayed answer counts). RESERVATION_NOT_FOUND ends it with an error: the
// reserve was acknowledged, so its reservation was lost.
func endUntilDefinite(ctx context.Context, s *stack, id string, kind stock.OpKind) error {
	lost := func(err error) bool { return reason(err) == "RESERVATION_NOT_FOUND" }
	err := untilDefinite(ctx, fmt.Sprintf("%s(%s)", kind, id), func(ctx context.Context) error {
		if kind == stock.OpCommit {
			_, err := s.inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: id}))
			return err
		}
		_, err := s.inv.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: id, Reason: "test"}))
		return err
	}, lost)
	if lost(err) {
		return fmt.Errorf("%s of reservation %s, whose reserve was acknowledged: %v (an acknowledged reserve was lost)", kind, id, err)
	}
	return err
}

// checkHistory checks a run: no oversell and no provable false sold-out;
// the history linearizable against one exact stock counter (porcupine);
// with after > 0, some success invoked after that time (the faults landed
// mid-sale); every acknowledged key exactly once in the ledger, no refused
// key at all, every reservation's end exactly once and never the other
// end; the units sold equal to the acknowledged ones, none left reserved;
// the books balanced.
func checkHistory(t *testing.T, s *stack, sku string, h *history, after int64, faults string) {
	t.Helper()
	late := 0
	for _, op := range h.ops {
		if op.Output.(bool) && op.Call > after {
			late++
		}
	}
	if after > 0 && late == 0 {
		t.Errorf("no success after %s: the sale ended before the faults did", time.Duration(after))
	}
	if err := provablyWrong(linStock, h.ops); err != nil {
		t.Fatalf("the history breaks the model: %v", err)
	}
	res := porcupine.CheckOperationsTimeout(stockModel(linStock), h.ops, 60*time.Second)
	counts := map[stock.OpKind]int{}
	for _, op := range h.ops {
		if op.Output.(bool) {
			counts[op.Input.(stockOp).kind]++
		}
	}
	sold := h.sold()
	// Refusals from memory (docs/soldout.md) are in the history like any
	// other: the model refuses one given while a unit is available, and so
	// one given after a hold or a transfer came back.
	fromMemory, err := s.sample("shardstock_allocator_soldout_memory_refusals_total")
	if err != nil {
		fromMemory = -1 // the allocator cannot be asked now
	}
	t.Logf("%d operations (%d deducts, %d reserves, %d commits, %d releases acknowledged; %d units sold, %d successes after %s; %d refused, %.0f from memory; %d calls retried after an unknown outcome) over %s with %s: %s",
		len(h.ops), counts[stock.OpDeduct], counts[stock.OpReserve], counts[stock.OpCommit], counts[stock.OpRelease], sold, late,
		time.Duration(after), len(h.refused), fromMemory, h.unknown, h.took.Round(time.Millisecond), faults, res)
	if res != porcupine.Ok {
		t.Fatalf("the history is not linearizable against one exact stock counter: %s", res)
	}
	byKey := map[string]map[stock.OpKind]int{} // idempotency key -> kind -> entries
	byID := map[string]map[stock.OpKind]int{}  // reservation id -> kind -> entries
	count := func(m map[string]map[stock.OpKind]int, k string, kind stock.OpKind) {
		if m[k] == nil {
			m[k] = map[stock.OpKind]int{}
		}
		m[k][kind]++
	}
	for _, e := range s.ledger(sku) {
		kind := stock.OpKind(e.GetKind())
		switch kind {
		case stock.OpDeduct, stock.OpReserve:
			count(byKey, e.GetIdempotencyKey(), kind)
		case stock.OpCommit, stock.OpRelease:
			count(byID, e.GetReservationId(), kind)
		}
	}
	for key, op := range h.acked {
		if n := byKey[key][op.kind]; n != 1 || len(byKey[key]) != 1 {
			t.Errorf("acknowledged %s %s has ledger entries %v, want one %s", op.kind, key, byKey[key], op.kind)
		}
	}
	for key := range h.refused {
		if len(byKey[key]) != 0 {
			t.Errorf("refused key %s has ledger entries %v, want none", key, byKey[key])
		}
	}
	for id, op := range h.ended {
		if n := byID[id][op.kind]; n != 1 || len(byID[id]) != 1 {
			t.Errorf("reservation %s (key %s), %s acknowledged, has ledger entries %v, want one %s", id, h.reserved[id], op.kind, byID[id], op.kind)
		}
	}
	if st := s.stock(sku); st.Sold != sold || st.Reserved != 0 || st.Available+st.Sold+st.Reserved+st.InTransit != linStock {
		t.Errorf("stock %v: want sold %d (the acknowledged units), none reserved, and conservation of %d", st, sold, linStock)
	}
	s.reconcile(sku)
}

// provablyWrong finds, without a search, what no linearization could
// explain: more units taken than there were (an oversell), or a refusal of
// q while the stock held at least q for the whole call (a false sold-out:
// the stock during the call is at least the initial stock, less every
// success that took units invoked before the refusal returned, plus every
// release that returned before it was invoked). porcupine decides the
// rest; on a wrong history its search may time out before it proves it,
// this check does not.
func provablyWrong(initial int64, history []porcupine.Operation) error {
	var taken int64
	for _, o := range history {
		op := o.Input.(stockOp)
		switch {
		case op.kind == stock.OpRelease:
			taken -= op.q
		case op.kind != stock.OpCommit && o.Output.(bool):
			taken += op.q
		}
	}
	if taken > initial {
		return fmt.Errorf("oversold: %d units acknowledged of %d", taken, initial)
	}
	for _, refusal := range history {
		if refusal.Output.(bool) {
			continue
		}
		left := initial
		for _, o := range history {
			op := o.Input.(stockOp)
			switch {
			case op.kind == stock.OpRelease && o.Return < refusal.Call:
				left += op.q
			case op.kind != stock.OpRelease && op.kind != stock.OpCommit && o.Output.(bool) && o.Call < refusal.Return:
				left -= op.q
			}
		}
		if q := refusal.Input.(stockOp).q; left >= q {
			return fmt.Errorf("false sold-out: a %s of %d refused at %s while at least %d units were left",
				refusal.Input.(stockOp).kind, q, time.Duration(refusal.Return), left)
		}
	}
	return nil
}

// pause waits d, and reports false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
