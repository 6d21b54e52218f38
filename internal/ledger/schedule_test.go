package ledger_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/topology"
)

// scheduled starts a scheduler of holder over store, with leases from
// etcd, that attempts a pass every interval until the test ends.
func scheduled(t *testing.T, e *etcdtest.Etcd, holder string, store ledger.Store, interval time.Duration) *prometheus.Registry {
	t.Helper()
	return scheduledWalking(t, e, holder, store, interval, 0)
}

// scheduledWalking is scheduled with passes that walk at most walkMax
// stretches (0: the default).
func scheduledWalking(t *testing.T, e *etcdtest.Etcd, holder string, store ledger.Store, interval time.Duration, walkMax int) *prometheus.Registry {
	t.Helper()
	moves := topology.NewMoveLeases(e.Client(), holder, 0, nil)
	reg := prometheus.NewRegistry()
	s := ledger.NewScheduler(ledger.SchedulerConfig{Store: store, TryLease: moves.TryReconcile, Interval: interval, WalkStretchesMax: walkMax,
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; moves.Close() })
	return reg
}

// value reads a gauge of reg, or with result a counter of that result.
func value(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() != name {
				continue
			}
			if result == "" {
				return m.GetGauge().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestScheduler_FindsUnbalanced: with no call to Reconcile, the scheduled
// pass finds the SKU whose row moved without an entry, and the metrics say
// so.
func TestScheduler_FindsUnbalanced(t *testing.T) {
	t.Parallel() // its own database (and etcd): nothing shared
	b := openBooks(t)
	for _, sku := range []string{"a", "b", "c"} {
		b.fill(t, sku, ledger.CheckpointEntries+10)
	}
	b.exec(t, `UPDATE shards SET available = available - 1 WHERE sku = 'b'`) // a unit gone, no entry
	reg := scheduled(t, etcdtest.Start(t), "alloc-a", b.db, time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for value(t, reg, "shardstock_reconcile_last_success_timestamp_seconds", "") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no scheduled reconciliation pass finished in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := value(t, reg, "shardstock_reconcile_unbalanced", ""); got != 1 {
		t.Errorf("shardstock_reconcile_unbalanced = %v, want 1 (sku b)", got)
	}
	if got := value(t, reg, "shardstock_reconcile_pass_skus", ""); got != 3 {
		t.Errorf("shardstock_reconcile_pass_skus = %v, want 3", got)
	}
}

// oneAtATime is a Store that counts the schedulers inside a pass at once:
// each Snapshot takes a while, so that two passes at once would overlap.
type oneAtATime struct {
	ledger.Store
	active, most *atomic.Int32
	passes       *atomic.Int32
	mu           *sync.Mutex
	holders      map[string]int
	holder       string
}

func (s oneAtATime) SKUs(ctx context.Context, after string, limit int) ([]string, error) {
	if after == "" {
		s.passes.Add(1)
		s.mu.Lock()
		s.holders[s.holder]++
		s.mu.Unlock()
	}
	return s.Store.SKUs(ctx, after, limit)
}

func (s oneAtATime) Snapshot(ctx context.Context, sku string) (ledger.Snapshot, error) {
	n := s.active.Add(1)
	defer s.active.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	time.Sleep(20 * time.Millisecond)
	return s.Store.Snapshot(ctx, sku)
}

// TestScheduler_OnePassAtATime: two allocators' schedulers against one
// etcd take turns; their passes never overlap, and each ran some.
func TestScheduler_OnePassAtATime(t *testing.T) {
	b := openBooks(t)
	for _, sku := range []string{"a", "b", "c"} {
		b.fill(t, sku, 10)
	}
	e := etcdtest.Start(t)
	var active, most, passes atomic.Int32
	var mu sync.Mutex
	holders := map[string]int{}
	regs := map[string]*prometheus.Registry{}
	for _, h := range []string{"alloc-a", "alloc-b"} {
		store := oneAtATime{Store: b.db, active: &active, most: &most, passes: &passes, mu: &mu, holders: holders, holder: h}
		regs[h] = scheduled(t, e, h, store, 25*time.Millisecond) // a pass takes about 60ms
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		both := holders["alloc-a"] >= 2 && holders["alloc-b"] >= 2
		mu.Unlock()
		if both {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("passes by holder after 20s: %v, want at least two each", holders)
		}
		time.Sleep(20 * time.Millisecond)
	}
	skipped := 0.0
	for _, reg := range regs {
		skipped += value(t, reg, "shardstock_reconcile_passes_total", "skipped")
	}
	// Proof that they contended: an attempt found the lease held.
	if skipped == 0 {
		t.Errorf("no attempt found the lease held (%d passes): the test did not make them contend", passes.Load())
	}
	if got := most.Load(); got != 1 {
		t.Errorf("at most %d passes ran at once, want 1", got)
	}
	t.Logf("%d passes (%v), %v attempts skipped, most at once %d", passes.Load(), holders, skipped, most.Load())
}
