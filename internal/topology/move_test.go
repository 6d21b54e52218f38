package topology

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/stock"
)

// One holder per SKU at a time: a second one is refused (TryAcquire) or
// waits (Acquire) until the first releases, and gets a higher token; a
// lease whose etcd lease is revoked reports itself lost and frees the SKU.
func TestMoveLeases_OneHolderPerSKU(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := NewMoveLeases(newClient(t, e.Endpoints()), "alloc-a", time.Second, nil)
	b := NewMoveLeases(newClient(t, e.Endpoints()), "alloc-b", time.Second, nil)
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)

	la, err := a.TryAcquire(ctx, "sku-1")
	if err != nil {
		t.Fatalf("a.TryAcquire = %v", err)
	}
	var se *stock.Error
	if _, err := b.TryAcquire(ctx, "sku-1"); !errors.As(err, &se) || se.Code != stock.CodeRebalanceInProgress {
		t.Fatalf("b.TryAcquire while a holds = %v, want REBALANCE_IN_PROGRESS", err)
	}
	if _, err := a.TryAcquire(ctx, "sku-1"); !errors.As(err, &se) || se.Code != stock.CodeRebalanceInProgress {
		t.Fatalf("a.TryAcquire while a holds = %v, want REBALANCE_IN_PROGRESS", err)
	}
	if other, err := b.TryAcquire(ctx, "sku-2"); err != nil {
		t.Fatalf("b.TryAcquire(sku-2) = %v", err)
	} else if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	leases, err := a.List(ctx)
	if err != nil || len(leases) != 1 || leases[0] != la.MoveLease {
		t.Fatalf("List = %+v, %v, want only %+v", leases, err, la.MoveLease)
	}

	got := make(chan *MoveLease, 1)
	go func() {
		lb, err := b.Acquire(ctx, "sku-1")
		if err != nil {
			t.Errorf("b.Acquire = %v", err)
		}
		got <- lb
	}()
	select {
	case <-got:
		t.Fatal("b.Acquire returned while a holds the lease")
	case <-time.After(300 * time.Millisecond):
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil || lb.Token <= la.Token {
		t.Fatalf("b's token after a released = %+v, want above a's %d", lb, la.Token)
	}

	// Revoke b's etcd lease, as an expiry would: b's lease is lost and the
	// SKU free for a, with a higher token still.
	if _, err := b.client.Revoke(ctx, b.lease.id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lb.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("b's lease not reported lost 5 s after its revocation")
	}
	la2, err := a.TryAcquire(ctx, "sku-1")
	if err != nil || la2.Token <= lb.Token {
		t.Fatalf("a.TryAcquire after b lost = %+v, %v, want a token above %d", la2, err, lb.Token)
	}
	// b gets a new etcd lease of its own for its next SKU.
	if _, err := b.TryAcquire(ctx, "sku-3"); err != nil {
		t.Fatalf("b.TryAcquire(sku-3) after its lease was lost = %v", err)
	}
}
