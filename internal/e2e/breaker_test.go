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
// of waiting for it.
func TestE2E_Breaker(t *testing.T) {
	s := newStack(t, 3)
	const sku = "brk"
	s.createSKU(sku, 10000, 16)
	ctx := context.Background()
	hung := s.shards["s1"]
	if err := hung.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer hung.cmd.Process.Signal(syscall.SIGCONT)

	// Within the lease TTL (2 s), so while the topology still names s1.
	var ok atomic.Int64
	parallel(t, 8, 30*time.Second, func(g int) {
		for i := 0; i < 12; i++ {
			rctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
			if _, err := s.deduct(rctx, sku, fmt.Sprintf("brk-%d-%d", g, i), 1); err == nil {
				ok.Add(1)
			}
			cancel()
		}
	})
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `shardstock_allocator_breaker_transitions_total{server="s1",state="open"}`) {
		t.Errorf("no open breaker for the hung server in /metrics")
	}
	if ok.Load() < 72 {
		t.Errorf("%d of 96 deducts succeeded while one of three servers hung, want at least 72 (without the breaker a third would wait on s1 and fail): the others' shards serve", ok.Load())
	}
	t.Logf("%d of 96 deducts succeeded with s1 hung", ok.Load())
	hung.cmd.Process.Signal(syscall.SIGCONT)
	s.waitStable(startTimeout)
	st := s.stock(sku)
	if st.Sold+st.Available != 10000 {
		t.Errorf("stock %v: sold + available != 10000", st)
	}
	s.reconcile(sku)
}
