package topology

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/faultproxy"
)

// TestSoldOut_DelayedWatch: an allocator whose watch is held back (its
// etcd answers delayed, as a slow link or a paused etcd member would)
// never sees the reopen that took a mark away; it still stops trusting
// the mark before the reopen's wait ends, so the stock that the reopen
// then brings back is never refused from the mark. Once its answers flow
// again it follows the marks anew. Without the freshness bound (Marked
// trusting whatever the view holds) the mark is trusted until the end.
func TestSoldOut_DelayedWatch(t *testing.T) {
	e := etcdtest.Start(t)
	px, err := faultproxy.Start(strings.TrimPrefix(e.Endpoints()[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() { cancel(); <-done })
	far := NewSoldOut(newClient(t, []string{"http://" + px.Addr()}), testLogger(t))
	go func() { done <- far.Run(ctx) }()
	near := NewSoldOut(newClient(t, e.Endpoints()), testLogger(t))

	const sku = "delayed"
	mark := func() {
		t.Helper()
		l, err := near.Look(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := near.Mark(ctx, l); err != nil || !ok {
			t.Fatalf("Mark(%+v) = %v, %v, want marked", l, ok, err)
		}
		waitMarked(t, far, sku, true)
	}
	mark()

	px.Partition()
	r, err := near.Reopen(ctx, sku, "restock", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	reopened := time.Now()
	if r.Wait < SoldOutFreshMax {
		t.Fatalf("Reopen of a marked SKU: Wait %s, want at least %s", r.Wait, SoldOutFreshMax)
	}
	var lastTrusted time.Duration
	for time.Since(reopened) < r.Wait+SoldOutFreshMax {
		if _, ok := far.Marked(sku); ok {
			lastTrusted = time.Since(reopened)
		}
		time.Sleep(time.Millisecond)
	}
	if lastTrusted >= r.Wait {
		t.Errorf("the delayed view trusted the mark %s after the reopen, want less than its wait %s", lastTrusted, r.Wait)
	}
	px.Heal()
	waitMarked(t, far, sku, false)
	if err := r.Done(ctx); err != nil {
		t.Fatal(err)
	}
	mark() // followed anew
}

// waitMarked waits until s's view of sku's mark is want.
func waitMarked(t *testing.T, s *SoldOut, sku string, want bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := s.Marked(sku); ok == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Marked(%s) not %v within 10 s", sku, want)
		}
	}
}

// TestSoldOut_IdleStopsAsking: a view no one reads stops asking etcd for
// progress answers after progressIdleTicks (an idle allocator's largest
// fixed cost), and trusts no mark then; the next read asks at once, and
// the mark is trusted again. A view that never stops asking, or a read
// that does not wake it, fails.
func TestSoldOut_IdleStopsAsking(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() { cancel(); <-done })
	view := NewSoldOut(newClient(t, e.Endpoints()), testLogger(t))
	go func() { done <- view.Run(ctx) }()
	marker := NewSoldOut(newClient(t, e.Endpoints()), testLogger(t))

	const sku = "idle"
	l, err := marker.Look(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := marker.Mark(ctx, l); err != nil || !ok {
		t.Fatalf("Mark(%+v) = %v, %v, want marked", l, ok, err)
	}
	waitMarked(t, view, sku, true)

	// Unread, the view stops asking (watched without calling Marked).
	for deadline := time.Now().Add(10 * time.Second); view.asking.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the view still asks for progress 10 s after its last read (%d requests)", view.asked.Load())
		}
	}
	before := view.asked.Load()
	time.Sleep(SoldOutFreshMax + 5*progressInterval)
	if n := view.asked.Load() - before; n != 0 {
		t.Fatalf("an unread view sent %d progress requests in %s, want 0", n, SoldOutFreshMax+5*progressInterval)
	}
	if _, ok := view.Marked(sku); ok {
		t.Fatal("an unread view still trusts its mark after SoldOutFreshMax without progress")
	}
	// That read woke it: the mark is trusted again.
	waitMarked(t, view, sku, true)
	if !view.asking.Load() {
		t.Fatal("a read view does not ask for progress")
	}
}
