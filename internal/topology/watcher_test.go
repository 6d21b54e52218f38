package topology

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/etcdtest"
)

func TestWatcher(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := NewWatcher(e.Client(), testPartitions)

	t.Run("BeforeRun", func(t *testing.T) {
		v := w.Snapshot()
		if v.AllOwned() || len(v.Servers()) != 0 {
			t.Errorf("Snapshot() before Run = %s, want empty", describe(v))
		}
		if _, _, ok := v.Owner(0); ok {
			t.Errorf("Owner(0) before Run: ok = true, want false")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := w.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitReady() with no owners = %v, want DeadlineExceeded", err)
		}
	})

	w = startWatcher(t, e.Client())
	first := w.Snapshot()
	startMember(t, e, l, "shard-a", memberOpts{})
	select {
	case <-first.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("Changed() not closed after a member registered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady() = %v, want nil", err)
	}
	v := w.Snapshot()
	if got, want := v.Servers(), []Server{{ID: "shard-a", Addr: "addr-shard-a"}}; !slices.Equal(got, want) {
		t.Errorf("Servers() = %v, want %v", got, want)
	}
	for p := range int32(testPartitions) {
		if s, epoch, ok := v.Owner(p); !ok || s.Addr != "addr-shard-a" || epoch <= 0 {
			t.Errorf("Owner(%d) = %v, %d, %v, want shard-a at addr-shard-a", p, s, epoch, ok)
		}
	}
	if _, _, ok := v.Owner(testPartitions); ok {
		t.Errorf("Owner(%d) out of range: ok = true, want false", testPartitions)
	}

	startMember(t, e, l, "shard-b", memberOpts{})
	select {
	case <-v.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("Changed() not closed after a second member registered")
	}
	v = waitView(t, w, 10*time.Second, "two members own their shares", ownedAsAssigned("shard-a", "shard-b"))
	if got, want := v.Servers(), []Server{{ID: "shard-a", Addr: "addr-shard-a"}, {ID: "shard-b", Addr: "addr-shard-b"}}; !slices.Equal(got, want) {
		t.Errorf("Servers() = %v, want %v", got, want)
	}
}

// TestWatcher_Keys checks how the view reads keys written by hand: an owner
// counts only while its server is registered, and keys it does not
// understand are skipped.
func TestWatcher_Keys(t *testing.T) {
	e := etcdtest.Start(t)
	w := startWatcher(t, e.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put := func(key, value string) int64 {
		t.Helper()
		resp, err := e.Client().Put(ctx, key, value)
		if err != nil {
			t.Fatalf("Put(%s) = %v", key, err)
		}
		return resp.Header.Revision
	}
	epoch := put(partitionKey(0), "ghost")
	put(partitionKey(testPartitions), "ghost") // beyond the partitions
	partitionsRev := put("/shardstock/partitions/x", "ghost")
	put(serversPrefix+"bad", "{not json")
	serversRev := put(serversPrefix+"liar", `{"id":"other","addr":"x"}`)
	v := waitView(t, w, 5*time.Second, "every put", func(v View) bool {
		return v.serversRev >= serversRev && v.partitionsRev >= partitionsRev
	})
	if got := v.Revision(); got != serversRev {
		t.Errorf("Revision() = %d, want %d", got, serversRev)
	}
	if _, _, ok := v.Owner(0); ok {
		t.Errorf("Owner(0) with its server unregistered: ok = true, want false")
	}
	if got := v.Servers(); len(got) != 0 {
		t.Errorf("Servers() = %v, want none (bad registrations skipped)", got)
	}

	put(serverKey("ghost"), `{"id":"ghost","addr":"ghost:1"}`)
	v = waitView(t, w, 5*time.Second, "ghost registered", func(v View) bool { _, ok := v.Server("ghost"); return ok })
	if s, got, ok := v.Owner(0); !ok || s.Addr != "ghost:1" || got != epoch {
		t.Errorf("Owner(0) = %v, %d, %v, want ghost at ghost:1, %d, true", s, got, ok, epoch)
	}
	if v.AllOwned() {
		t.Errorf("AllOwned() = true with one partition owned, want false")
	}
}

// TestWatcher_Resync cuts the watcher off etcd while the topology changes
// and compacts etcd past what it saw, so that its watch cannot resume: it
// must fail with ErrCompacted and load again. The test first proves the
// watch broke that way, then that the new load sees the change.
func TestWatcher_Resync(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	px := startProxy(t, e.Endpoints()[0])
	failures := &watchFailures{}
	w := startWatcherLogged(t, newClient(t, px.endpoints()), slog.New(failures))
	startMember(t, e, l, "shard-a", memberOpts{})
	waitView(t, w, 10*time.Second, "shard-a owns all", ownedAsAssigned("shard-a"))

	px.setCut(true)
	startMember(t, e, l, "shard-b", memberOpts{})
	share := 0
	for _, s := range Assign(testPartitions, []string{"shard-a", "shard-b"}) {
		if s == "shard-b" {
			share++
		}
	}
	waitFor(t, 15*time.Second, "shard-b holds its share", func() bool { return l.holders()["shard-b"] == share })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.Client().Get(ctx, "compact-point")
	if err != nil {
		t.Fatalf("Get = %v", err)
	}
	if _, err := e.Client().Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("Compact(%d) = %v", resp.Header.Revision, err)
	}
	if v := w.Snapshot(); ownedAsAssigned("shard-a", "shard-b")(v) {
		t.Fatalf("the cut-off watcher saw the change already: %s", describe(v))
	}
	px.setCut(false)

	// The fault: the watch broke on the compaction and was loaded again.
	waitFor(t, 15*time.Second, "a watch failure with ErrCompacted", func() bool {
		return failures.seen(rpctypes.ErrCompacted)
	})
	waitView(t, w, 15*time.Second, "both own their shares after the heal", ownedAsAssigned("shard-a", "shard-b"))
}
