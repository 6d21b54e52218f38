package topology

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/stock"
)

// The first process decides the first placement, later ones read it; a
// published version reaches a watching process; Locked serializes.
func TestPlacements_LoadPublishWatch(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"a", "b"}, stock.Placement{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"other"}, stock.Placement{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(b.Current().Databases()); got != "[a b]" {
		t.Fatalf("second process's placement names %s, want the first's [a b]", got)
	}
	if _, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"Bad Name"}, stock.Placement{}, nil); err == nil {
		t.Fatal("LoadPlacements with a bad name: no error")
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go b.Watch(wctx)

	p, err := publish(ctx, a, []string{"a", "b", "c"})
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
		p, err := publish(ctx, b, []string{"a", "c"})
		if err != nil {
			t.Error(err)
		}
		published <- p.Version()
	}()
	err = a.Locked(ctx, func(stock.Placement, int64) error {
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

// publish adds a version over databases, as internal/dbset does (without
// its databases).
func publish(ctx context.Context, p *Placements, databases []string) (stock.Placement, error) {
	var out stock.Placement
	err := p.Locked(ctx, func(cur stock.Placement, _ int64) error {
		next, err := cur.Next(databases)
		if err != nil {
			return err
		}
		out = next
		return p.Put(ctx, next)
	})
	return out, err
}

// A lost or rolled-back placement is never replaced by a lower version:
// a process that starts with the databases' record restores it, one that
// holds a newer version restores it under the lock; the lock's fencing
// tokens grow; Put by a holder whose lock is gone writes nothing.
func TestPlacements_Restore(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := newClient(t, e.Endpoints())
	a, err := LoadPlacements(ctx, cli, []string{"a"}, stock.Placement{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v1 := a.Current()
	v2, err := publish(ctx, a, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("KeyDeleted", func(t *testing.T) {
		if _, err := cli.Delete(ctx, placementKey); err != nil {
			t.Fatal(err)
		}
		b, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"c"}, v2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Current().Version(); got != 2 {
			t.Fatalf("LoadPlacements over a deleted key with version 2 recorded = version %d, want 2", got)
		}
		if resp, err := cli.Get(ctx, placementKey); err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("placement key after the restore: %v, %v", resp, err)
		}
	})
	t.Run("RolledBack", func(t *testing.T) {
		val, _ := json.Marshal(v1)
		if _, err := cli.Put(ctx, placementKey, string(val)); err != nil {
			t.Fatal(err)
		}
		b, err := LoadPlacements(ctx, newClient(t, e.Endpoints()), []string{"a", "b"}, v2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Current().Version(); got != 2 {
			t.Fatalf("LoadPlacements over version 1 with version 2 recorded = version %d, want 2", got)
		}
	})
	t.Run("DeletedWhileRunning", func(t *testing.T) {
		if _, err := cli.Delete(ctx, placementKey); err != nil {
			t.Fatal(err)
		}
		var seen int64
		if err := a.Locked(ctx, func(p stock.Placement, _ int64) error { seen = p.Version(); return nil }); err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, placementKey)
		if err != nil || len(resp.Kvs) != 1 || seen != 2 {
			t.Fatalf("Locked over a deleted key saw version %d and left %v, %v; want version 2 put back", seen, resp, err)
		}
	})
	t.Run("Fence", func(t *testing.T) {
		var first, second int64
		a.Locked(ctx, func(_ stock.Placement, fence int64) error { first = fence; return nil })
		a.Locked(ctx, func(_ stock.Placement, fence int64) error { second = fence; return nil })
		if first <= 0 || second <= first {
			t.Fatalf("fencing tokens %d then %d, want growing", first, second)
		}
		err := a.Locked(ctx, func(cur stock.Placement, _ int64) error {
			// The lock lost, as when its lease expires.
			if _, err := cli.Delete(ctx, placementLockKey, clientv3.WithPrefix()); err != nil {
				return err
			}
			next, err := cur.Next([]string{"b"})
			if err != nil {
				return err
			}
			return a.Put(ctx, next)
		})
		if err == nil {
			t.Fatal("Put by a holder whose lock was gone succeeded")
		}
	})
}
