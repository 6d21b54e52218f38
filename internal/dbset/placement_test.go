package dbset

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// etcdClient is a client of the etcd at endpoints, closed with the test.
func etcdClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// openSet opens a Set over dbs as a process started with -databases
// given does (internal/cmd/startup.Open): it loads the placement from the
// etcd at endpoints, or the databases' record of it, and records it.
func openSet(t *testing.T, dbs map[string]*postgres.DB, endpoints []string, given []string) *Set {
	t.Helper()
	ctx := context.Background()
	recorded, err := Recorded(ctx, dbs)
	if err != nil {
		t.Fatal(err)
	}
	p, err := topology.LoadPlacements(ctx, etcdClient(t, endpoints), given, recorded, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s, err := New(dbs, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// placementKey is topology's key of the placement.
const placementKey = "/shardstock/placement"

// TestSet_PlacementLost: SKUs created under two placement versions (v1 on
// a alone, v2 over a and b); then the placement key is lost (deleted, or
// etcd rolled back to a snapshot holding v1) and a new process starts with
// -databases a,b. Every SKU is still found, in its one database; creating
// any of them again is refused; no SKU is ever in two databases.
func TestSet_PlacementLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(ctx context.Context, cli *clientv3.Client, v1 string) error
	}{
		{"KeyDeleted", func(ctx context.Context, cli *clientv3.Client, _ string) error {
			_, err := cli.Delete(ctx, placementKey)
			return err
		}},
		{"RolledBack", func(ctx context.Context, cli *clientv3.Client, v1 string) error {
			_, err := cli.Put(ctx, placementKey, v1)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, dbs, endpoints := newSetAt(t, []string{"a", "b"}, []string{"a"})
			cli := etcdClient(t, endpoints)
			const n = 24
			var names []string
			for i := range n {
				name := fmt.Sprintf("v1-%d", i)
				if err := s.CreateSKU(ctx, sku(name), 10); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			}
			got, err := cli.Get(ctx, placementKey)
			if err != nil || len(got.Kvs) != 1 {
				t.Fatalf("Get(%s) = %v, %v", placementKey, got, err)
			}
			v1 := string(got.Kvs[0].Value)
			if _, err := s.SetPlacement(ctx, []string{"a", "b"}); err != nil {
				t.Fatal(err)
			}
			onB := 0
			for i := range n {
				name := fmt.Sprintf("v2-%d", i)
				if err := s.CreateSKU(ctx, sku(name), 10); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
				if w := where(t, dbs, name); len(w) == 1 && w[0] == "b" {
					onB++
				}
			}
			if onB == 0 {
				t.Fatal("no SKU of version 2 went to b: the test tests nothing")
			}

			if err := tc.lose(ctx, cli, v1); err != nil {
				t.Fatal(err)
			}
			later := openSet(t, dbs, endpoints, []string{"a", "b"})
			for _, name := range names {
				if got, err := later.GetSKU(ctx, name); err != nil || got.Name != name {
					t.Errorf("GetSKU(%s) after the placement was lost = %v, %v, want the SKU", name, got, err)
				}
				if err := later.CreateSKU(ctx, sku(name), 10); stock.CodeOf(err) != stock.CodeSKUExists {
					t.Errorf("CreateSKU(%s) again after the placement was lost = %v, want SKU_ALREADY_EXISTS", name, err)
				}
				if w := where(t, dbs, name); len(w) != 1 {
					t.Errorf("%s is in %v, want one database", name, w)
				}
			}
			if v := later.Placement().Version(); v < 2 {
				t.Errorf("placement version after the loss = %d, want at least 2 (never a lower one silently)", v)
			}
		})
	}
}

// TestSet_CreateSKUPausedPastLock: an allocator inside CreateSKU, past its
// checks, pauses for longer than the placement lock lives; meanwhile
// another publishes a placement that sends the SKU elsewhere and creates
// it there. When the first wakes, its insert is refused: one SKU, one
// database.
func TestSet_CreateSKUPausedPastLock(t *testing.T) {
	ctx := context.Background()
	first, dbs, endpoints := newSetAt(t, []string{"a", "b"}, []string{"a", "b"})
	second := openSet(t, dbs, endpoints, []string{"a", "b"})
	cli := etcdClient(t, endpoints)
	name := ""
	for i := 0; name == ""; i++ {
		if c := fmt.Sprintf("x-%d", i); first.Placement().Newest(c) == "a" {
			name = c
		}
	}
	paused, resume := make(chan struct{}), make(chan struct{})
	createHook = func(s *Set, sku string) {
		if s == first && sku == name {
			close(paused)
			<-resume
		}
	}
	t.Cleanup(func() { createHook = nil })
	done := make(chan error, 1)
	go func() { done <- first.CreateSKU(ctx, sku(name), 10) }()
	<-paused
	// The first's lock is gone, as when its lease expires while it is
	// paused: the second takes the lock at once.
	if _, err := cli.Delete(ctx, "/shardstock/locks/placement", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := second.SetPlacement(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	if err := second.CreateSKU(ctx, sku(name), 10); err != nil {
		t.Fatalf("CreateSKU(%s) by the second = %v", name, err)
	}
	if w := where(t, dbs, name); len(w) != 1 || w[0] != "b" {
		t.Fatalf("%s is in %v, want b", name, w)
	}
	close(resume)
	err := <-done
	if w := where(t, dbs, name); len(w) != 1 {
		t.Fatalf("%s is in %v after the paused CreateSKU woke (it answered %v): one SKU in two databases", name, w, err)
	}
	if !strings.Contains(fmt.Sprint(err), "fenced") || stock.CodeOf(err) != stock.CodeShardUnavailable {
		t.Fatalf("the paused CreateSKU after it lost the lock = %v, want fenced, SHARD_UNAVAILABLE", err)
	}
}
