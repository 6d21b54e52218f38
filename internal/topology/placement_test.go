package topology

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/stock"
)

// The first process decides the first placement, later ones read it; a
// published version reaches a watching process; Locked serializes.
func TestPlacements_LoadPublishWatch(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"a", "b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"other"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(b.Current().Databases()); got != "[a b]" {
		t.Fatalf("second process's placement names %s, want the first's [a b]", got)
	}
	if _, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"Bad Name"}, nil); err == nil {
		t.Fatal("LoadPlacements with a bad name: no error")
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go b.Watch(wctx)

	p, err := a.Publish(ctx, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Version() != 2 || p.SlotCounts()["c"] != 341 {
		t.Fatalf("published version %d with %v slots", p.Version(), p.SlotCounts())
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Current().Version() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the watching process never saw version 2")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Locked excludes Publish: a publish started while f runs waits for it.
	inside, published := make(chan struct{}), make(chan int64, 1)
	go func() {
		<-inside
		p, err := b.Publish(ctx, []string{"a", "c"})
		if err != nil {
			t.Error(err)
		}
		published <- p.Version()
	}()
	err = a.Locked(ctx, func(p stock.Placement) error {
		close(inside)
		select {
		case v := <-published:
			return fmt.Errorf("version %d published while the lock was held", v)
		case <-time.After(300 * time.Millisecond):
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := <-published; v != 3 {
		t.Fatalf("version after the lock %d, want 3", v)
	}
}
