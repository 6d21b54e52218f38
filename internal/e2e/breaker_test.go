package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// Bounds of TestE2E_Breaker. Nothing in it waits a fixed time or expects a
// call to finish within a tight deadline: it waits for the breaker's
// transitions (the allocator's /metrics), each wait bounded generously.
const (
	// breakerLeaseTTL keeps the hung server the owner of its partitions
	// for the whole test, however slow the machine: its breaker must open
	// while the topology still routes to it. With the fixture's 2 s lease
	// that was a race with the lease running out (the takeover after a
	// stop is TestE2E_StoppedShardServer's). The Member counts its lease
	// lost TTL/6 early and renews it every TTL/6, so the stopped server
	// stays the owner for at least 40 s.
	breakerLeaseTTL = time.Minute
	// breakerOpenWait bounds the wait for the hung server's breaker.
	breakerOpenWait = 30 * time.Second
	// breakerTripTimeout is the deadline of the calls that trip it: each
	// call to the hung server fails when it runs out (at least
	// breakerSlowCallMin, 50 ms, after it was sent, so it counts), and a
	// live server answers far sooner, even on a loaded machine.
	breakerTripTimeout = 2 * time.Second
	// breakerRouteTimeout is the deadline of the calls that must be routed
	// around the hung server: long enough for one that rides the
	// breaker's probe (half-open) to see it fail (keep-alive pings, 3 s)
	// and go to another shard.
	breakerRouteTimeout = 20 * time.Second
)

// TestE2E_Breaker: a shard server that hangs (SIGSTOP: it neither answers
// nor dies, and its partitions stay its own while its lease lasts) trips its
// circuit breaker; then requests go to the other servers' shards: the
// allocator sends the hung server nothing but the breaker's probes, and
// every request succeeds. The running servers' breakers stay closed.
func TestE2E_Breaker(t *testing.T) {
	s := newStackLease(t, 3, "", breakerLeaseTTL)
	const sku = "brk"
	s.createSKU(sku, 10000, 16)
	ctx := context.Background()
	// Start-up hand-overs claim partitions in etcd before the new owner has
	// taken them over in Postgres: wait until every shard answers.
	for i := 0; i < 64; i++ {
		for attempt := 0; ; attempt++ {
			if _, err := s.deduct(ctx, sku, fmt.Sprintf("warm-%d", i), 1); err == nil {
				break
			} else if attempt > 100 {
				t.Fatalf("warm-up deduct: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	const hungID = "s1"
	sample := func(id, state string) string {
		return `shardstock_allocator_breaker_transitions_total{server="` + id + `",state="` + state + `"}`
	}
	// Counted when the breaker lets a call through, before it is sent.
	sentSample := `shardstock_allocator_execute_calls_total{server="` + hungID + `"}`
	hung := s.shards[hungID]
	if err := hung.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer hung.cmd.Process.Signal(syscall.SIGCONT)

	// Trip: 8 closed-loop clients until the breaker is seen open. About a
	// third of the keys go first to a shard of the hung server and wait
	// there until their deadline; nothing it owns can succeed, so its
	// failures only add up.
	var opened atomic.Bool
	var n atomic.Int64
	parallel(t, 8, breakerOpenWait+breakerTripTimeout+5*time.Second, func(g int) {
		start := time.Now()
		for i := 0; !opened.Load() && time.Since(start) < breakerOpenWait; i++ {
			rctx, cancel := context.WithTimeout(ctx, breakerTripTimeout)
			s.deduct(rctx, sku, fmt.Sprintf("trip-%d-%d", g, i), 1)
			cancel()
			n.Add(1)
			if s.allocatorCounter(sample(hungID, "open")) > 0 {
				opened.Store(true)
			}
		}
	})
	if !opened.Load() {
		t.Fatalf("the breaker of hung server %s did not open within %s (%d requests)", hungID, breakerOpenWait, n.Load())
	}
	// It opened while the hung server still owned its partitions: what
	// follows tests the breaker, not a takeover.
	topo, err := s.admin.GetTopology(ctx, adminReq(&v1.GetTopologyRequest{}))
	if err != nil {
		t.Fatalf("GetTopology = %v", err)
	}
	owned := 0
	for _, o := range topo.Msg.Owners {
		if o.ServerId == hungID {
			owned++
		}
	}
	if owned == 0 {
		t.Fatalf("hung server %s owns no partition any more: its lease ran out before the breaker opened", hungID)
	}

	// Route around: 48 requests, a third of them first bound for the hung
	// server's shards. Each must succeed, and the allocator may send the
	// hung server only the breaker's probes: one Execute call per
	// half-open transition (MaxRequests 1), plus one for a transition
	// counted before this phase whose probe is sent during it.
	sent0, half0 := s.allocatorCounter(sentSample), s.allocatorCounter(sample(hungID, "half-open"))
	var ok atomic.Int64
	parallel(t, 8, 2*6*breakerRouteTimeout, func(g int) {
		for i := range 6 {
			key := fmt.Sprintf("brk-%d-%d", g, i)
			rctx, cancel := context.WithTimeout(ctx, breakerRouteTimeout)
			if _, err := s.deduct(rctx, sku, key, 1); err != nil {
				t.Errorf("Deduct(%s) with %s hung and its breaker open = %v, want success on another server's shard", key, hungID, err)
			} else {
				ok.Add(1)
			}
			cancel()
		}
	})
	sent, probes := s.allocatorCounter(sentSample)-sent0, s.allocatorCounter(sample(hungID, "half-open"))-half0
	t.Logf("%d trip requests; then %d of 48 deducts succeeded with %s hung; calls sent to it meanwhile %d, half-open transitions %d", n.Load(), ok.Load(), hungID, sent, probes)
	if sent > probes+1 {
		t.Errorf("%d calls sent to hung server %s while its breaker was open, want at most its %d probes + 1", sent, hungID, probes)
	}
	// The running servers' breakers stay closed: they answered every call
	// within its deadline.
	for _, id := range []string{"s2", "s3"} {
		if n := s.allocatorCounter(sample(id, "open")); n != 0 {
			t.Errorf("the breaker of running server %s opened %d times", id, n)
		}
	}

	hung.cmd.Process.Signal(syscall.SIGCONT)
	s.waitStable(startTimeout)
	st := s.stock(sku)
	if st.Sold+st.Available != 10000 || st.Sold < 64+48 {
		t.Errorf("stock %v: sold + available != 10000, or fewer than the %d acknowledged deducts sold", st, 64+48)
	}
	s.reconcile(sku)
}
