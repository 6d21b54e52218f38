package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"

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
// restarted. Every call is recorded (invoke, and each key's first definite
// answer after retries with the same key); the history must be
// linearizable against one exact stock counter (porcupine), every
// acknowledged success must be in the ledger exactly once and no refused
// key at all, the stock sold must equal the successes, and the books must
// balance.
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

	start := time.Now()
	var mu sync.Mutex
	var history []porcupine.Operation
	acked := map[string]int64{} // key -> quantity, acknowledged successes
	refused := map[string]bool{}
	var restarted int64 // when Postgres answered again
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

	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
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
		mu.Lock()
		restarted = time.Since(start).Nanoseconds()
		mu.Unlock()
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
				key := fmt.Sprintf("lin-%03d", i)
				q := int64(1 + rnd.IntN(3))
				call := time.Since(start).Nanoseconds()
				var ok, definite bool
				for try := 0; try < linRetryMax && ctx.Err() == nil; try++ {
					actx, acancel := context.WithTimeout(ctx, 3*time.Second)
					_, err := s.deduct(actx, sku, key, q)
					acancel()
					if err == nil {
						ok, definite = true, true
						break
					}
					if reason(err) == "OUT_OF_STOCK" {
						definite = true
						break
					}
					if code := connect.CodeOf(err); code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded &&
						code != connect.CodeAborted && code != connect.CodeUnknown && code != connect.CodeCanceled {
						t.Errorf("Deduct(%s) = %v: not a retryable answer", key, err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				if !definite {
					t.Errorf("key %s had no definite answer after %d tries", key, linRetryMax)
					return
				}
				ret := time.Since(start).Nanoseconds()
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: q, Call: call, Output: ok, Return: ret})
				if ok {
					acked[key] = q
				} else {
					refused[key] = true
				}
				mu.Unlock()
				time.Sleep(linPause)
			}
		})
	}
	wg.Wait()
	<-faultsDone
	if t.Failed() {
		t.FailNow()
	}
	s.waitStable(startTimeout)

	// The faults landed mid-sale: some key succeeded after Postgres was back.
	after := 0
	for _, op := range history {
		if op.Output.(bool) && op.Call > restarted {
			after++
		}
	}
	if restarted == 0 || after == 0 {
		t.Errorf("no success after Postgres restarted (at %s): the sale ended before the faults did", time.Duration(restarted))
	}
	if err := provablyWrong(linStock, history); err != nil {
		t.Fatalf("the history breaks the model: %v", err)
	}
	res := porcupine.CheckOperationsTimeout(stockModel(linStock), history, 60*time.Second)
	var sold int64
	for _, q := range acked {
		sold += q
	}
	t.Logf("%d operations (%d acknowledged, %d units, %d of them after Postgres restarted; %d refused) over %s with a shard server killed, one stopped past its lease, Postgres crashed: %s",
		len(history), len(acked), sold, after, len(refused), time.Since(start).Round(time.Millisecond), res)
	if res != porcupine.Ok {
		t.Fatalf("the history is not linearizable against one exact stock counter: %s", res)
	}
	entries := map[string]int{}
	for _, e := range s.ledger(sku) {
		if e.GetKind() == "deduct" {
			entries[e.GetIdempotencyKey()]++
		}
	}
	for key := range acked {
		if entries[key] != 1 {
			t.Errorf("acknowledged key %s has %d ledger entries, want 1", key, entries[key])
		}
	}
	for key := range refused {
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
