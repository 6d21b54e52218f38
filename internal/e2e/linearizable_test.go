package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"

	"github.com/shardstock/shardstock/internal/faultproxy"
	"github.com/shardstock/shardstock/internal/pgcluster"
)

// stockModel is one exact stock counter: a deduct of q succeeds iff the
// stock holds at least q, and takes q; a refusal (OUT_OF_STOCK) leaves it.
// A key's retries are one operation: the client's first call to its first
// definite answer (a success, a replayed success or OUT_OF_STOCK).
func stockModel(initial int64) porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return initial },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			st, q, ok := state.(int64), input.(int64), output.(bool)
			if ok {
				return st >= q, st - q
			}
			return st < q, st
		},
		Equal: func(a, b interface{}) bool { return a.(int64) == b.(int64) },
		DescribeOperation: func(input, output interface{}) string {
			return fmt.Sprintf("deduct(%d) -> %v", input.(int64), output.(bool))
		},
	}
}

// Bounds of the linearizability run.
const (
	linClients    = 24
	linOpsMax     = 700 // keys in all: about 1,400 units asked of 1,000
	linStock      = 1000
	linPause      = 200 * time.Millisecond // between one client's keys: the sale outlasts the faults
	linRetryMax   = 200                    // tries of one key before the test gives up on it
	linRunTimeout = 90 * time.Second
)

// TestE2E_LinearizableUnderFaults drives deducts of 1 to 3 units on one hot
// SKU through the public API from 24 clients while faults land: a shard
// server killed (-9) and restarted, another stopped (SIGSTOP) past its
// lease and continued (the zombie must be fenced), and Postgres crashed and
// restarted. The history is checked by checkHistory.
func TestE2E_LinearizableUnderFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	pg, err := pgcluster.Start(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	s := newStackOpts(t, stackOpts{shardServers: 3, dbURL: pg.URL()})
	const sku = "linear"
	s.createSKU(sku, linStock, 8)

	var restarted atomic.Int64 // when Postgres answered again, since the run's start
	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		step := func(d time.Duration) bool {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(d):
				return true
			}
		}
		if !step(300 * time.Millisecond) {
			return
		}
		s.shards["s1"].stop(syscall.SIGKILL) // kill -9 mid-batch
		if !step(700 * time.Millisecond) {
			return
		}
		s.startShard("s1")
		s2 := s.shards["s2"]
		s2.cmd.Process.Signal(syscall.SIGSTOP) // past its 2 s lease: a zombie
		if !step(2500 * time.Millisecond) {
			s2.cmd.Process.Signal(syscall.SIGCONT)
			return
		}
		s2.cmd.Process.Signal(syscall.SIGCONT)
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
	checkHistory(t, s, sku, h, restarted.Load(), "a shard server killed, one stopped past its lease, Postgres crashed")
}

// TestE2E_LinksCutUnderLoad puts a fault-injecting TCP proxy between the
// allocator and each shard server (the address they register is the
// proxy's) and, every 150 ms through the load, cuts a link: either before
// a deduct reaches the shard server, or after it did, losing only its
// answer, each cut closing the whole HTTP/2 connection and every call on
// it. The history is checked by checkHistory.
func TestE2E_LinksCutUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	var proxies []*faultproxy.Proxy
	s := newStackOpts(t, stackOpts{startShards: func(s *stack) {
		for i := 1; i <= 3; i++ {
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			p, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			proxies = append(proxies, p)
			id := fmt.Sprintf("s%d", i)
			s.shards[id] = s.start(id, filepath.Join(bin, "shard"), "-id", id, "-addr", fmt.Sprintf("127.0.0.1:%d", port),
				"-advertise", p.Addr(), "-lease-ttl", s.leaseTTL.String(), "-db-max-conns", "8", "-log-level", "warn")
		}
	}})
	const sku = "linkcut"
	s.createSKU(sku, linStock, 8)

	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		rnd := rand.New(rand.NewPCG(3, 5))
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(150 * time.Millisecond):
			}
			cut := faultproxy.CutReply
			if i%2 == 1 {
				cut = faultproxy.CutRequest
			}
			// Any deduct of this SKU: its name is in every request's body.
			proxies[rnd.IntN(len(proxies))].Arm([]byte(sku), cut)
		}
	})
	cuts := int64(0)
	for _, p := range proxies {
		cuts += p.Cuts()
	}
	if cuts < 5 {
		t.Errorf("%d links cut during the load, want at least 5", cuts)
	}
	checkHistory(t, s, sku, h, 0, fmt.Sprintf("%d links between the allocator and the shard servers cut", cuts))
}

// history is one run's recorded operations and what was acknowledged.
type history struct {
	ops     []porcupine.Operation
	acked   map[string]int64 // key -> quantity, acknowledged successes
	refused map[string]bool
	took    time.Duration
}

// runHistory drives linOpsMax deducts of 1 to 3 units of sku from
// linClients clients, each key retried with the same key after every
// unknown outcome until a definite answer, while faults runs (it gets the
// run's clock, in ns since its start, and ends with ctx). Each key is one
// operation: its first call to its first definite answer.
func runHistory(ctx context.Context, t *testing.T, s *stack, sku string, faults func(ctx context.Context, since func() int64)) *history {
	t.Helper()
	start := time.Now()
	since := func() int64 { return time.Since(start).Nanoseconds() }
	h := &history{acked: map[string]int64{}, refused: map[string]bool{}}
	var mu sync.Mutex
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
				q := int64(1 + rnd.IntN(3))
				call := since()
				ok, err := deductUntilDefinite(ctx, s, sku, key, q)
				if err != nil {
					t.Error(err)
					return
				}
				ret := since()
				mu.Lock()
				h.ops = append(h.ops, porcupine.Operation{ClientId: c, Input: q, Call: call, Output: ok, Return: ret})
				if ok {
					h.acked[key] = q
				} else {
					h.refused[key] = true
				}
				mu.Unlock()
				time.Sleep(linPause)
			}
		})
	}
	wg.Wait()
	stopFaults()
	<-faultsDone
	h.took = time.Since(start)
	if t.Failed() {
		t.FailNow()
	}
	s.waitStable(startTimeout)
	return h
}

// deductUntilDefinite sends a deduct and retries it with the same key
// after every unknown outcome: ok is a success (or a replayed one), !ok
// OUT_OF_STOCK.
func deductUntilDefinite(ctx context.Context, s *stack, sku, key string, q int64) (ok bool, err error) {
	for try := 0; try < linRetryMax && ctx.Err() == nil; try++ {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := s.deduct(actx, sku, key, q)
		acancel()
		if err == nil {
			return true, nil
		}
		if reason(err) == "OUT_OF_STOCK" {
			return false, nil
		}
		if code := connect.CodeOf(err); code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded &&
			code != connect.CodeAborted && code != connect.CodeUnknown && code != connect.CodeCanceled {
			return false, fmt.Errorf("Deduct(%s) = %v: not a retryable answer", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false, fmt.Errorf("key %s had no definite answer after %d tries", key, linRetryMax)
}

// checkHistory checks a run: no oversell and no provable false sold-out;
// the history linearizable against one exact stock counter (porcupine);
// with after > 0, some success invoked after that time (the faults landed
// mid-sale); every acknowledged key exactly once in the ledger and no
// refused key at all; the units sold equal to the acknowledged ones; the
// books balanced.
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
	var sold int64
	for _, q := range h.acked {
		sold += q
	}
	t.Logf("%d operations (%d acknowledged, %d units, %d of them after %s; %d refused) over %s with %s: %s",
		len(h.ops), len(h.acked), sold, late, time.Duration(after), len(h.refused), h.took.Round(time.Millisecond), faults, res)
	if res != porcupine.Ok {
		t.Fatalf("the history is not linearizable against one exact stock counter: %s", res)
	}
	entries := map[string]int{}
	for _, e := range s.ledger(sku) {
		if e.GetKind() == "deduct" {
			entries[e.GetIdempotencyKey()]++
		}
	}
	for key := range h.acked {
		if entries[key] != 1 {
			t.Errorf("acknowledged key %s has %d ledger entries, want 1", key, entries[key])
		}
	}
	for key := range h.refused {
		if entries[key] != 0 {
			t.Errorf("refused key %s has %d ledger entries, want 0", key, entries[key])
		}
	}
	if st := s.stock(sku); st.Sold != sold || st.Available+st.Sold+st.InTransit != linStock {
		t.Errorf("stock %v: want sold %d (the acknowledged units) and conservation of %d", st, sold, linStock)
	}
	s.reconcile(sku)
}

// provablyWrong finds, without a search, what no linearization could
// explain: more units acknowledged than there were (an oversell), or a
// refusal of q while the stock held at least q for the whole call (a
// false sold-out: the stock at the refusal's return is at least the
// initial stock less every success invoked before then). porcupine decides
// the rest; on a wrong history its search may time out before it proves
// it, this check does not.
func provablyWrong(initial int64, history []porcupine.Operation) error {
	var sold int64
	for _, op := range history {
		if op.Output.(bool) {
			sold += op.Input.(int64)
		}
	}
	if sold > initial {
		return fmt.Errorf("oversold: %d units acknowledged of %d", sold, initial)
	}
	for _, op := range history {
		if op.Output.(bool) {
			continue
		}
		left := initial
		for _, o := range history {
			if o.Output.(bool) && o.Call < op.Return {
				left -= o.Input.(int64)
			}
		}
		if q := op.Input.(int64); left >= q {
			return fmt.Errorf("false sold-out: a deduct of %d refused at %s while at least %d units were left", q, time.Duration(op.Return), left)
		}
	}
	return nil
}

// freePort returns a port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
