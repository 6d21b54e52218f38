package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestE2E_Breaker: a shard server that hangs (SIGSTOP: it neither answers
// nor dies, so its partitions stay its own until its lease runs out) trips
// its circuit breaker, and requests go to the other servers' shards instead
// of waiting for it; the running servers' breakers stay closed.
func TestE2E_Breaker(t *testing.T) {
	s := newStack(t, 3)
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
	hung := s.shards["s1"]
	if err := hung.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer hung.cmd.Process.Signal(syscall.SIGCONT)

	// Within the lease TTL (2 s), so while the topology still names s1:
	// 8 clients, 6 requests each of at most 250 ms, and more (up to 20, for
	// at most 1.7 s after the stop) while the breaker has not opened yet:
	// on a loaded machine some calls to s1 end as late callers, which do
	// not count against it.
	const openSample = `shardstock_allocator_breaker_transitions_total{server="s1",state="open"}`
	metrics := func() string {
		resp, err := http.Get(s.base + "/metrics")
		if err != nil {
			t.Error(err)
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	stopped := time.Now()
	var ok atomic.Int64
	var opened atomic.Bool
	parallel(t, 8, 30*time.Second, func(g int) {
		for i := 0; i < 6 || (i < 20 && !opened.Load() && time.Since(stopped) < 1700*time.Millisecond); i++ {
			rctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
			if _, err := s.deduct(rctx, sku, fmt.Sprintf("brk-%d-%d", g, i), 1); err == nil && i < 6 {
				ok.Add(1) // of the first 48
			}
			cancel()
			if g == 0 && i >= 5 && strings.Contains(metrics(), openSample) {
				opened.Store(true)
			}
		}
	})
	body := metrics()
	if !strings.Contains(body, openSample) {
		t.Errorf("no open breaker for the hung server in /metrics")
	}
	// The running servers' breakers stay closed: a call whose callers'
	// deadline ran out at once is not the server failing.
	for _, id := range []string{"s2", "s3"} {
		if strings.Contains(body, `shardstock_allocator_breaker_transitions_total{server="`+id+`",state="open"}`) {
			t.Errorf("the breaker of running server %s opened", id)
		}
	}
	if ok.Load() < 16 {
		t.Errorf("%d of 48 deducts succeeded while one of three servers hung, want at least 16 (one hung server once made it 4 to 9): the others' shards serve", ok.Load())
	}
	t.Logf("%d of 48 deducts succeeded with s1 hung", ok.Load())
	// Its lease runs out and the others take its partitions over: the
	// takeover must not wait for the hung server's open transaction.
	s.waitStable(leaseTTL + 10*time.Second)
	hung.cmd.Process.Signal(syscall.SIGCONT)
	s.waitStable(startTimeout)
	st := s.stock(sku)
	if st.Sold+st.Available != 10000 || st.Sold < 64 {
		t.Errorf("stock %v: sold + available != 10000", st)
	}
	s.reconcile(sku)
}
