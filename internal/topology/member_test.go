package topology

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/stock"
)

const (
	leaseTTLTest = 2 * time.Second
	// takeoverSlack is the time allowed, beyond the lease TTL, for a dead
	// member's partitions to be owned again.
	takeoverSlack = 5 * time.Second
)

func TestMember_OwnsAll(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := startWatcher(t, e.Client())
	a := startMember(t, e, l, "shard-a", memberOpts{})

	v := waitView(t, w, 10*time.Second, "shard-a owns all", ownedAsAssigned("shard-a"))
	waitFor(t, 5*time.Second, "shard-a Owned()", func() bool { return len(a.Owned()) == testPartitions })
	first := a.Owned()
	seen := make(map[int64]int32)
	for p, epoch := range first {
		if q, dup := seen[epoch]; dup {
			t.Errorf("partitions %d and %d share epoch %d, want distinct epochs", p, q, epoch)
		}
		seen[epoch] = p
		if s, got, ok := v.Owner(p); !ok || s.ID != "shard-a" || s.Addr != "addr-shard-a" || got != epoch {
			t.Errorf("View.Owner(%d) = %v, %d, %v, want shard-a, %d, true", p, s, got, ok, epoch)
		}
	}

	// A graceful leave stops every write, then deletes every key at once.
	a.stop(t)
	if got := l.holders(); len(got) != 0 {
		t.Errorf("after leave, holders = %v, want none", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, prefix := range []string{serversPrefix, partitionsPrefix} {
		resp, err := e.Client().Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 0 {
			t.Errorf("after leave, Get(%s) = %v keys, %v, want 0, nil", prefix, resp.Count, err)
		}
	}
	if got := a.Owned(); len(got) != 0 {
		t.Errorf("after leave, Owned() = %v, want empty", got)
	}

	// A takeover gets larger epochs than any before it.
	b := startMember(t, e, l, "shard-b", memberOpts{})
	waitView(t, w, 10*time.Second, "shard-b owns all", ownedAsAssigned("shard-b"))
	waitFor(t, 5*time.Second, "shard-b Owned()", func() bool { return len(b.Owned()) == testPartitions })
	for p, epoch := range b.Owned() {
		if epoch <= first[p] {
			t.Errorf("partition %d: takeover epoch %d, want > %d", p, epoch, first[p])
		}
	}
}

func TestMember_AcquireFails(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := startWatcher(t, e.Client())
	const flaky, failures = int32(3), 2
	a := startMember(t, e, l, "shard-a", memberOpts{fail: func(p int32, attempt int) error {
		if p == flaky && attempt <= failures {
			return errors.New("fence: database unavailable")
		}
		return nil
	}})
	waitView(t, w, 10*time.Second, "shard-a owns all", ownedAsAssigned("shard-a"))
	waitFor(t, 5*time.Second, "shard-a Owned()", func() bool { return len(a.Owned()) == testPartitions })

	l.mu.Lock()
	attempts, loses, acquires := l.attempts[flaky], l.loses["shard-a"], l.acquires["shard-a"]
	l.mu.Unlock()
	if attempts != failures+1 {
		t.Errorf("Acquire(%d) called %d times, want %d", flaky, attempts, failures+1)
	}
	if loses != 0 || acquires != testPartitions {
		t.Errorf("Acquire succeeded %d times and Lose called %d times, want %d and 0", acquires, loses, testPartitions)
	}
	// The failed claims were deleted, so the key the view settles on is
	// the one that was Acquired.
	want := a.Owned()[flaky]
	waitView(t, w, 5*time.Second, "the Acquired key of the flaky partition", func(v View) bool {
		_, epoch, ok := v.Owner(flaky)
		return ok && epoch == want
	})
}

// TestMember_Death kills one of three members without a graceful leave and
// measures how long until the survivors own its partitions.
func TestMember_Death(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := startWatcher(t, e.Client())
	ids := []string{"shard-a", "shard-b", "shard-c"}
	members := map[string]*runningMember{}
	for _, id := range ids {
		members[id] = startMember(t, e, l, id, memberOpts{leaseTTL: leaseTTLTest, abandon: id == "shard-c"})
	}
	before := waitView(t, w, 10*time.Second, "three members own their shares", ownedAsAssigned(ids...))
	if !before.AllOwned() {
		t.Fatalf("AllOwned() = false for %s", describe(before))
	}
	assigned := Assign(testPartitions, ids)
	for _, id := range ids {
		want := sharesOf(assigned, id)
		waitFor(t, 5*time.Second, id+" Owned() is its share", func() bool {
			return slices.Equal(slices.Sorted(maps.Keys(members[id].Owned())), want)
		})
	}

	// Death: Run returns without releasing or revoking, and the client
	// goes away with the process.
	died := time.Now()
	members["shard-c"].stop(t)
	members["shard-c"].client.Close()
	after := waitView(t, w, leaseTTLTest+takeoverSlack, "survivors own everything", ownedAsAssigned("shard-a", "shard-b"))
	took := time.Since(died)
	t.Logf("takeover after death: %v (lease TTL %v)", took, leaseTTLTest)
	if took > leaseTTLTest+takeoverSlack {
		t.Errorf("takeover took %v, want <= %v", took, leaseTTLTest+takeoverSlack)
	}
	for _, p := range sharesOf(assigned, "shard-c") {
		_, was, _ := before.Owner(p)
		if _, now, _ := after.Owner(p); now <= was {
			t.Errorf("partition %d: epoch after takeover %d, want > %d", p, now, was)
		}
	}
}

// TestMember_Join starts a third member: it takes over its share from the
// two others, which stop writing each partition before it is claimed.
func TestMember_Join(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := startWatcher(t, e.Client())
	startMember(t, e, l, "shard-a", memberOpts{})
	startMember(t, e, l, "shard-b", memberOpts{})
	before := waitView(t, w, 10*time.Second, "two members own their shares", ownedAsAssigned("shard-a", "shard-b"))

	c := startMember(t, e, l, "shard-c", memberOpts{})
	after := waitView(t, w, 10*time.Second, "three members own their shares", ownedAsAssigned("shard-a", "shard-b", "shard-c"))
	share := sharesOf(Assign(testPartitions, []string{"shard-a", "shard-b", "shard-c"}), "shard-c")
	waitFor(t, 5*time.Second, "shard-c Owned() is its share", func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(c.Owned())), share)
	})
	for p := range int32(testPartitions) {
		s0, e0, _ := before.Owner(p)
		s1, e1, _ := after.Owner(p)
		switch moved := s0.ID != s1.ID; {
		case moved && (s1.ID != "shard-c" || e1 <= e0):
			t.Errorf("partition %d moved from %s@%d to %s@%d, want to shard-c at a larger epoch", p, s0.ID, e0, s1.ID, e1)
		case !moved && e1 != e0:
			t.Errorf("partition %d stayed with %s but its epoch changed %d -> %d", p, s0.ID, e0, e1)
		}
	}
	if got, want := l.holders()["shard-c"], len(share); got != want {
		t.Errorf("ownership log: shard-c holds %d partitions, want %d", got, want)
	}
}

// TestMember_Partition cuts one member off etcd. It must stop writing
// before its lease can expire, so that no two members ever believe they
// own a partition at once (the ownership log checks), and take its share back
// once the network heals.
func TestMember_Partition(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := startWatcher(t, e.Client())
	px := startProxy(t, e.Endpoints()[0])
	ids := []string{"shard-a", "shard-b", "shard-c"}
	startMember(t, e, l, "shard-a", memberOpts{leaseTTL: leaseTTLTest})
	startMember(t, e, l, "shard-b", memberOpts{leaseTTL: leaseTTLTest})
	c := startMember(t, e, l, "shard-c", memberOpts{leaseTTL: leaseTTLTest, endpoints: px.endpoints()})
	waitView(t, w, 10*time.Second, "three members own their shares", ownedAsAssigned(ids...))
	share := sharesOf(Assign(testPartitions, ids), "shard-c")
	waitFor(t, 5*time.Second, "shard-c Owned() is its share", func() bool { return len(c.Owned()) == len(share) })

	cut := time.Now()
	px.setCut(true)
	waitFor(t, leaseTTLTest+time.Second, "shard-c loses everything on its own clock", func() bool { return len(c.Owned()) == 0 })
	lost := time.Since(cut)
	waitView(t, w, leaseTTLTest+takeoverSlack, "survivors own everything", ownedAsAssigned("shard-a", "shard-b"))
	t.Logf("partitioned member lost its partitions after %v; survivors owned them after %v", lost, time.Since(cut))

	px.setCut(false)
	waitView(t, w, 20*time.Second, "shard-c back with its share", ownedAsAssigned(ids...))
	waitFor(t, 5*time.Second, "shard-c Owned() is its share", func() bool { return len(c.Owned()) == len(share) })
}

func TestMember_InvalidConfig(t *testing.T) {
	e := etcdtest.Start(t)
	owner := &fakeOwner{l: newLedger(t), id: "x"}
	for name, cfg := range map[string]MemberConfig{
		"NoClient":     {ServerID: "x", Owner: owner},
		"NoOwner":      {Client: e.Client(), ServerID: "x"},
		"NoID":         {Client: e.Client(), Owner: owner},
		"SlashInID":    {Client: e.Client(), ServerID: "a/b", Owner: owner},
		"TooManyParts": {Client: e.Client(), ServerID: "x", Owner: owner, Partitions: partitionsMax + 1},
		"LongLease":    {Client: e.Client(), ServerID: "x", Owner: owner, LeaseTTL: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			if err := NewMember(cfg).Run(context.Background()); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Run() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func sharesOf(assigned map[int32]string, id string) []int32 {
	var out []int32
	for p, s := range assigned {
		if s == id {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// TestMember_FullPartitions owns stock.Partitions partitions with three
// members, to show that claiming them all is fast.
func TestMember_FullPartitions(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := NewWatcher(e.Client(), stock.Partitions)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	start := time.Now()
	for _, id := range []string{"shard-a", "shard-b", "shard-c"} {
		c := newClient(t, e.Endpoints())
		m := NewMember(MemberConfig{Client: c, ServerID: id, Addr: "addr-" + id, Owner: &fakeOwner{l: l, id: id}, Logger: testLogger(t)})
		mctx, mcancel := context.WithCancel(context.Background())
		mdone := make(chan error, 1)
		go func() { mdone <- m.Run(mctx) }()
		t.Cleanup(func() { mcancel(); <-mdone })
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	if err := w.WaitReady(rctx); err != nil {
		t.Fatalf("WaitReady() = %v", err)
	}
	t.Logf("3 members own %d partitions after %v", stock.Partitions, time.Since(start))
	waitFor(t, 10*time.Second, "ownership log holds every partition", func() bool {
		n := 0
		for _, c := range l.holders() {
			n += c
		}
		return n == stock.Partitions
	})
}

// TestMember_Restart kills a member and starts it again under the same id
// before its old lease expires: it deletes the keys of its old lease and
// claims them again at once, instead of waiting for the expiry.
func TestMember_Restart(t *testing.T) {
	const leaseTTL = 10 * time.Second
	e := etcdtest.Start(t)
	l := newLedger(t)
	w := startWatcher(t, e.Client())
	old := startMember(t, e, l, "shard-a", memberOpts{leaseTTL: leaseTTL, abandon: true})
	before := waitView(t, w, 10*time.Second, "shard-a owns all", ownedAsAssigned("shard-a"))
	old.stop(t)
	old.client.Close()

	restarted := time.Now()
	startMember(t, e, l, "shard-a", memberOpts{leaseTTL: leaseTTL})
	after := waitView(t, w, leaseTTL/2, "restarted shard-a owns all at new epochs", func(v View) bool {
		if !ownedAsAssigned("shard-a")(v) {
			return false
		}
		for p := range int32(testPartitions) {
			_, was, _ := before.Owner(p)
			if _, now, _ := v.Owner(p); now <= was {
				return false
			}
		}
		return true
	})
	t.Logf("restart under the same id owned everything again after %v (lease TTL %v)", time.Since(restarted), leaseTTL)
	if !after.AllOwned() {
		t.Errorf("AllOwned() = false after restart")
	}
}

// Settled (a shard server's readiness) is true only while the member owns
// exactly its assignment: not while a partition it is assigned fails to be
// acquired, and again once it is.
func TestMember_Settled(t *testing.T) {
	e := etcdtest.Start(t)
	l := newLedger(t)
	var failing atomic.Bool
	failing.Store(true)
	a := startMember(t, e, l, "shard-a", memberOpts{fail: func(p int32, _ int) error {
		if p == 3 && failing.Load() {
			return errors.New("not now")
		}
		return nil
	}})
	if a.Settled() {
		t.Fatal("Settled before Run registered")
	}
	waitFor(t, 10*time.Second, "shard-a owns all but partition 3", func() bool { return len(a.Owned()) == testPartitions-1 })
	for range 20 {
		if a.Settled() {
			t.Fatal("Settled while partition 3, assigned to it, is not acquired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	failing.Store(false)
	waitFor(t, 15*time.Second, "shard-a settled", a.Settled)
}
