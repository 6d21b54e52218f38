package allocator_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
)

// stableTimeout bounds the wait for every partition to reach the owner
// rendezvous hashing assigns it.
const stableTimeout = 60 * time.Second

// stack is a database, an embedded etcd, shard servers in this process
// (served over HTTP/2 as cmd/shard serves them, or called directly as an
// allocator's own -shard-id server is) and an allocator over them.
type stack struct {
	t   testing.TB
	url string
	db  *postgres.DB
	// store is what allocators and shard servers read SKUs from: db, or
	// with a second database (newStackDBs) a dbset over both.
	store   allocator.Store
	topo    func() topology.View
	servers map[string]*shard.Server
	// metrics are each shard server's own registry.
	metrics map[string]*prometheus.Registry
	local   string
	alloc   *allocator.Allocator
	etcd    *etcdtest.Etcd
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newStack starts shard servers remote (over RPC) and, unless local is "",
// one the allocator calls in-process, and waits until the partitions have
// settled on them.
func newStack(t testing.TB, remote []string, local string) *stack {
	t.Helper()
	return newStackDBs(t, remote, local, false)
}

// newStackDBs is newStack; with second, SKUs are placed half on the
// database named main (s.db) and half on one named second, as
// SHARDSTOCK_DATABASES places them: the allocators read through a dbset,
// and each shard server serves both databases.
func newStackDBs(t testing.TB, remote []string, local string, second bool) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := pgtest.NewMigratedDB(t)
	db := openDB(t, url)
	var store allocator.Store = db
	newServer := func(id string, reg prometheus.Registerer) *shard.Server {
		return shard.New(shard.Config{ServerID: id, DB: db, Logger: quiet(), Registerer: reg})
	}
	if second {
		set := twoDatabases(t, db, openDB(t, pgtest.NewMigratedDB(t)))
		store = set
		newServer = func(id string, reg prometheus.Registerer) *shard.Server {
			dbs := map[string]shard.Store{}
			for _, name := range set.Names() {
				dbs[name] = set.DB(name)
			}
			return shard.New(shard.Config{ServerID: id, DBs: dbs, Locate: set.Locate, Logger: quiet(), Registerer: reg})
		}
	}
	e := etcdtest.Start(t)
	var stopped []chan struct{}
	t.Cleanup(func() {
		cancel()
		for _, c := range stopped {
			<-c
		}
	})
	run := func(f func()) {
		c := make(chan struct{})
		stopped = append(stopped, c)
		go func() { defer close(c); f() }()
	}
	w := topology.NewWatcher(e.Client(), stock.Partitions)
	run(func() { w.Run(ctx) })
	s := &stack{t: t, url: url, db: db, store: store, topo: w.Snapshot, servers: map[string]*shard.Server{}, metrics: map[string]*prometheus.Registry{}, local: local, etcd: e}
	ids := slices.Clone(remote)
	if local != "" {
		ids = append(ids, local)
	}
	for _, id := range ids {
		reg := prometheus.NewRegistry()
		srv := newServer(id, reg)
		s.servers[id], s.metrics[id] = srv, reg
		run(func() { srv.Run(ctx) })
		addr := "127.0.0.1:1" // the local server is never dialled
		if id != local {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr = lis.Addr().String()
			mux := http.NewServeMux()
			mux.Handle(shardstockv1connect.NewShardServiceHandler(&api.ShardHandler{Server: srv}, transport.HandlerOptions()...))
			run(func() { transport.Serve(ctx, lis, mux) })
		}
		m := topology.NewMember(topology.MemberConfig{Client: e.Client(), ServerID: id, Addr: addr, LeaseTTL: 2 * time.Second, Owner: srv, Logger: quiet()})
		run(func() { m.Run(ctx) })
	}
	s.waitStable(ids)
	s.alloc = s.newAllocator()
	return s
}

// openDB opens the database at url for a stack.
func openDB(t testing.TB, url string) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), url, postgres.Options{MaxConns: 8, ApplicationName: "allocatortest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// twoDatabases is a dbset over main and second whose placement spreads
// new SKUs evenly over both, recorded in each.
func twoDatabases(t testing.TB, main, second *postgres.DB) *dbset.Set {
	t.Helper()
	p, err := stock.Placement{}.Next([]string{stock.DefaultDatabase, "second"})
	if err != nil {
		t.Fatal(err)
	}
	set, err := dbset.New(map[string]*postgres.DB{stock.DefaultDatabase: main, "second": second}, &dbset.Fixed{P: p})
	if err != nil {
		t.Fatal(err)
	}
	set.SetLogger(quiet())
	if err := set.Record(context.Background()); err != nil {
		t.Fatal(err)
	}
	return set
}

// newAllocator returns another allocator over the stack, with no hints
// and no cached SKUs of its own.
func (s *stack) newAllocator() *allocator.Allocator { return s.newAllocatorWith(nil) }

// newAllocatorWith is newAllocator with its Config changed by edit.
func (s *stack) newAllocatorWith(edit func(*allocator.Config)) *allocator.Allocator {
	// The rebalancer's rounds would move stock under the tests' feet; the
	// rebalancer's own tests turn them on (newMover).
	cfg := allocator.Config{DB: s.store, Topology: s.topo, Logger: quiet(),
		Rebalance: rebalance.Config{Off: true, Auto: rebalance.AutoShards{Off: true}}}
	if edit != nil {
		edit(&cfg)
	}
	if s.local != "" {
		cfg.Local, cfg.LocalID = s.servers[s.local], s.local
	}
	a := allocator.New(cfg)
	s.t.Cleanup(a.Close)
	return a
}

// waitStable waits until every partition is owned, in etcd and by its
// server's fences, by the server rendezvous hashing assigns it.
func (s *stack) waitStable(ids []string) {
	s.t.Helper()
	want := topology.Assign(stock.Partitions, ids)
	deadline := time.Now().Add(stableTimeout)
	for {
		v, ok := s.topo(), true
		for p := range int32(stock.Partitions) {
			srv, _, owned := v.Owner(p)
			if !owned || srv.ID != want[p] {
				ok = false
				break
			}
			if _, held := s.servers[srv.ID].Owned()[p]; !held {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("partitions not settled on %v within %s", ids, stableTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createSKU creates a SKU through the allocator.
func (s *stack) createSKU(name string, shards int32, initial int64) {
	s.t.Helper()
	if _, err := s.alloc.CreateSKU(context.Background(), stock.SKU{Name: name, Shards: shards}, initial); err != nil {
		s.t.Fatalf("CreateSKU(%s, %d shards, %d) = %v", name, shards, initial, err)
	}
}

// available returns the available count of each shard of a SKU.
func (s *stack) available(sku string) []int64 {
	s.t.Helper()
	st, err := s.alloc.GetStock(context.Background(), sku)
	if err != nil {
		s.t.Fatalf("GetStock(%s) = %v", sku, err)
	}
	out := make([]int64, len(st.Shards))
	for i, sh := range st.Shards {
		out[i] = sh.Available
	}
	return out
}

// balanced fails the test unless the SKU's books reconcile.
func (s *stack) balanced(sku string) {
	s.t.Helper()
	ds, err := s.alloc.Reconcile(context.Background(), sku)
	if err != nil || len(ds) > 0 {
		s.t.Errorf("Reconcile(%s) = %+v, %v, want no discrepancy", sku, ds, err)
	}
}

// keyFor returns a key named after prefix whose first-choice shard of n is
// want: FNV-32a of the key, mod n.
func keyFor(t *testing.T, prefix string, n, want int32) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprintf("%s-%d", prefix, i)
		h := fnv.New32a()
		h.Write([]byte(k))
		if int32(h.Sum32()%uint32(n)) == want {
			return k
		}
	}
	t.Fatalf("no key %s-* with first choice %d of %d", prefix, want, n)
	return ""
}

func deduct(sku, key string, q int64) *stock.Request {
	return &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku}, Quantity: q, Key: key}
}

func codeOf(res stock.Result) stock.Code {
	if res.Err == nil {
		return ""
	}
	return res.Err.Code
}

// codeOfErr is err's code, "" for no error.
func codeOfErr(err error) stock.Code {
	if err == nil {
		return ""
	}
	return stock.CodeOf(err)
}

// TestAllocator_Take: reserves and deducts go to the key's first choice,
// then by hints; a shard that answers not enough is skipped; every shard
// is swept before OUT_OF_STOCK, and stock split over shards is
// consolidated; a retry gets its first result, even after a sell-out.
func TestAllocator_Take(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()
	take := func(a *allocator.Allocator, r *stock.Request) stock.Result {
		t.Helper()
		return a.Allocate(ctx, r)
	}
	// mustTake takes r and returns the shard that served it.
	mustTake := func(a *allocator.Allocator, r *stock.Request) int32 {
		t.Helper()
		res := take(a, r)
		if res.Err != nil {
			t.Fatalf("Take(%s %s %d) = %v, want success", r.Kind, r.Key, r.Quantity, res.Err)
		}
		return res.Operation.Shard
	}

	t.Run("FirstChoice", func(t *testing.T) {
		s.createSKU("first", 4, 40)
		for want := range int32(4) {
			k := keyFor(t, "fc", 4, want)
			if got := mustTake(s.alloc, deduct("first", k, 1)); got != want {
				t.Errorf("Take(deduct %s) served by shard %d, want its first choice %d", k, got, want)
			}
		}
	})
	t.Run("HintsMostAvailableFirst", func(t *testing.T) {
		// 10 on each shard; then 3, 9 and 0.
		s.createSKU("hints", 3, 30)
		mustTake(s.alloc, deduct("hints", keyFor(t, "h1", 3, 1), 7))  // shard 1: 3 left
		mustTake(s.alloc, deduct("hints", keyFor(t, "h2", 3, 2), 1))  // shard 2: 9 left
		mustTake(s.alloc, deduct("hints", keyFor(t, "h0", 3, 0), 10)) // shard 0: 0 left
		// Shard 0 is short; by distance shard 1 (3, enough) comes next, but
		// the hints put shard 2 (9) first.
		k := keyFor(t, "h", 3, 0)
		if got := mustTake(s.alloc, deduct("hints", k, 3)); got != 2 {
			t.Errorf("Take(deduct %s 3) served by shard %d, want 2 (the most available by hint)", k, got)
		}
	})
	t.Run("SkipsShardWithNotEnough", func(t *testing.T) {
		s.createSKU("skip", 2, 10) // 5 on each
		mustTake(s.alloc, deduct("skip", keyFor(t, "drain", 2, 0), 5))
		// Another allocator has no hint: shard 0 answers not enough, and
		// the request moves on to shard 1.
		b := s.newAllocator()
		k := keyFor(t, "next", 2, 0)
		if got := mustTake(b, deduct("skip", k, 3)); got != 1 {
			t.Errorf("Take(deduct %s 3) served by shard %d, want 1 (shard 0 is empty)", k, got)
		}
		if got, want := s.available("skip"), []int64{0, 2}; !slices.Equal(got, want) {
			t.Errorf("available = %v, want %v", got, want)
		}
	})
	t.Run("CheckBeforeOutOfStock", func(t *testing.T) {
		s.createSKU("check", 2, 2) // 1 on each
		mustTake(s.alloc, deduct("check", keyFor(t, "d", 2, 0), 1))
		mustTake(s.alloc, deduct("check", keyFor(t, "d", 2, 1), 1))
		// s.alloc's hints say both shards are empty; another allocator
		// replenishes one. The sold-out check finds it.
		b := s.newAllocator()
		if res := b.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: "check"}, Quantity: 5, Key: "restock"}); res.Err != nil {
			t.Fatalf("Give(replenish 5) = %v", res.Err)
		}
		if res := take(s.alloc, deduct("check", "after-restock", 2)); res.Err != nil {
			t.Errorf("Take(deduct 2) after another allocator restocked = %v, want success (swept, not sold out)", res.Err)
		}
		if res := take(s.alloc, deduct("check", "too-many", 4)); codeOf(res) != stock.CodeOutOfStock {
			t.Errorf("Take(deduct 4) with 3 in stock = %+v, want OUT_OF_STOCK", res)
		}
		s.balanced("check")
	})
	t.Run("Consolidation", func(t *testing.T) {
		s.createSKU("split", 4, 12) // 3 on each
		res := take(s.alloc, deduct("split", "big", 10))
		if res.Err != nil {
			t.Fatalf("Take(deduct 10) with 3 on each of 4 shards = %v, want success after consolidating", res.Err)
		}
		var sum int64
		for _, a := range s.available("split") {
			sum += a
		}
		if sum != 2 {
			t.Errorf("available after consolidating and deducting 10 of 12 = %d, want 2", sum)
		}
		ts, err := s.alloc.ListTransfers(ctx, stock.TransferFilter{SKU: "split"}, "", 100)
		if err != nil || len(ts) == 0 {
			t.Errorf("ListTransfers(split) = %d transfers, %v, want the consolidation's", len(ts), err)
		}
		for _, tr := range ts {
			if tr.To != res.Operation.Shard {
				t.Errorf("transfer %s to shard %d, want to %d, the shard that served the request", tr.ID, tr.To, res.Operation.Shard)
			}
		}
		s.balanced("split")
	})
	t.Run("Replay", func(t *testing.T) {
		s.createSKU("replay", 2, 4)
		first := take(s.alloc, deduct("replay", "once", 1))
		if first.Err != nil {
			t.Fatalf("Take(deduct once) = %v", first.Err)
		}
		again := take(s.alloc, deduct("replay", "once", 1))
		if again.Err != nil || !again.Replayed || again.Operation.Shard != first.Operation.Shard {
			t.Errorf("Take(deduct once) again = %+v, want a replay of shard %d", again, first.Operation.Shard)
		}
		if res := take(s.alloc, deduct("replay", "once", 2)); codeOf(res) != stock.CodeIdempotencyKeyReused {
			t.Errorf("Take(deduct once, another quantity) = %+v, want IDEMPOTENCY_KEY_REUSED", res)
		}
		// Sell out; s.alloc's hints then say every shard is empty, so a
		// retry is answered from the sold-out check's lookup of its key.
		for i := 0; ; i++ {
			if res := take(s.alloc, deduct("replay", fmt.Sprint("rest-", i), 1)); res.Err != nil {
				if codeOf(res) != stock.CodeOutOfStock || i != 3 {
					t.Fatalf("Take(deduct rest-%d) = %v, want OUT_OF_STOCK after 3", i, res.Err)
				}
				break
			}
		}
		late := take(s.alloc, deduct("replay", "once", 1))
		if late.Err != nil || !late.Replayed || late.Operation.Shard != first.Operation.Shard {
			t.Errorf("Take(deduct once) after the sell-out = %+v, want a replay of shard %d", late, first.Operation.Shard)
		}
	})
	t.Run("Refusals", func(t *testing.T) {
		if _, err := s.alloc.CreateSKU(ctx, stock.SKU{Name: "limited", Shards: 2, MaxPerOrder: 3}, 10); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			r    *stock.Request
			want stock.Code
		}{
			{"ZeroQuantity", deduct("limited", "z", 0), stock.CodeInvalidQuantity},
			{"NoKey", deduct("limited", "", 1), stock.CodeInvalidIdempotencyKey},
			{"NoSKU", deduct("", "k", 1), stock.CodeInvalidSKU},
			{"UnknownSKU", deduct("nosuch", "k", 1), stock.CodeSKUNotFound},
			{"AboveMaxPerOrder", deduct("limited", "mpo-4", 4), stock.CodeQuantityAboveMaxPerOrder},
			// More than any one shard and refused whatever the stock: no
			// stock moves for it.
			{"AboveMaxPerOrderAndShard", deduct("limited", "mpo-6", 6), stock.CodeQuantityAboveMaxPerOrder},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if res := take(s.alloc, tc.r); codeOf(res) != tc.want {
					t.Errorf("Take(%+v) = %v, want %s", tc.r, res.Err, tc.want)
				}
			})
		}
		if ts, err := s.alloc.ListTransfers(ctx, stock.TransferFilter{SKU: "limited"}, "", 10); err != nil || len(ts) != 0 {
			t.Errorf("ListTransfers(limited) = %d, %v, want none", len(ts), err)
		}
		paused := true
		if _, err := s.alloc.UpdateSKU(ctx, "limited", stock.SKUUpdate{Paused: &paused}); err != nil {
			t.Fatal(err)
		}
		if res := take(s.alloc, deduct("limited", "p", 1)); codeOf(res) != stock.CodeSKUPaused {
			t.Errorf("Take(deduct) of a paused SKU = %v, want SKU_PAUSED", res.Err)
		}
	})
}

// TestAllocator_End: a commit or release goes to the shard its reservation
// id names.
func TestAllocator_End(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()
	s.createSKU("end", 4, 40)
	reserve := func(key string, q int64) *stock.Reservation {
		t.Helper()
		res := s.alloc.Allocate(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: "end"}, Quantity: q, Key: key})
		if res.Err != nil || res.Reservation == nil {
			t.Fatalf("Take(reserve %s %d) = %+v, want a reservation", key, q, res)
		}
		return res.Reservation
	}
	end := func(kind stock.OpKind, id string) stock.Result {
		return s.alloc.EndReservation(ctx, &stock.Request{Kind: kind, ReservationID: id})
	}
	shardCounts := func(idx int32) stock.Counts {
		t.Helper()
		st, err := s.alloc.GetStock(ctx, "end")
		if err != nil {
			t.Fatal(err)
		}
		return st.Shards[idx].Counts
	}

	t.Run("Commit", func(t *testing.T) {
		r := reserve(keyFor(t, "c", 4, 3), 2)
		if r.Shard != 3 {
			t.Fatalf("reservation on shard %d, want 3", r.Shard)
		}
		res := end(stock.OpCommit, r.ID)
		if res.Err != nil || res.Reservation == nil || res.Reservation.Shard != 3 {
			t.Fatalf("End(commit %s) = %+v, want success on shard 3", r.ID, res)
		}
		if c := shardCounts(3); c.Reserved != 0 || c.Sold != 2 {
			t.Errorf("shard 3 after commit = %+v, want 0 reserved and 2 sold", c)
		}
		if res := end(stock.OpRelease, r.ID); codeOf(res) != stock.CodeReservationAlreadyCommitted {
			t.Errorf("End(release) of a committed reservation = %v, want RESERVATION_ALREADY_COMMITTED", res.Err)
		}
	})
	t.Run("Release", func(t *testing.T) {
		r := reserve(keyFor(t, "r", 4, 1), 4)
		if res := end(stock.OpRelease, r.ID); res.Err != nil || res.Reservation == nil || res.Reservation.Shard != 1 {
			t.Fatalf("End(release %s) = %+v, want success on shard 1", r.ID, res)
		}
		if c := shardCounts(1); c.Reserved != 0 || c.Available != 10 {
			t.Errorf("shard 1 after release = %+v, want 0 reserved and 10 available", c)
		}
	})
	t.Run("BadID", func(t *testing.T) {
		for _, tc := range []struct {
			id   string
			want stock.Code
		}{
			{"", stock.CodeInvalidArgument},
			{"not-a-reservation", stock.CodeReservationNotFound},
		} {
			if res := end(stock.OpCommit, tc.id); codeOf(res) != tc.want {
				t.Errorf("End(commit %q) = %v, want %s", tc.id, res.Err, tc.want)
			}
		}
	})
	s.balanced("end")
}

// TestAllocator_Give: a replenish goes to the key's first choice; a
// negative adjustment is routed like a deduct.
func TestAllocator_Give(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()
	s.createSKU("give", 3, 0)
	k := keyFor(t, "g", 3, 2)
	if res := s.alloc.AdjustStock(ctx, &stock.Request{Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: "give"}, Quantity: 7, Key: k}); res.Err != nil || res.Operation.Shard != 2 {
		t.Fatalf("Give(replenish %s 7) = %+v, want success on shard 2", k, res)
	}
	if got, want := s.available("give"), []int64{0, 0, 7}; !slices.Equal(got, want) {
		t.Errorf("available after replenish = %v, want %v", got, want)
	}
	adjust := func(key string, delta int64, approver string) stock.Result {
		return s.alloc.AdjustStock(ctx, &stock.Request{Kind: stock.OpAdjust, Shard: stock.ShardKey{SKU: "give"}, Quantity: delta, Key: key, Reason: "count", Approver: approver})
	}
	// Its first choice (shard 0) is empty: it is taken where the stock is.
	k = keyFor(t, "adj", 3, 0)
	if res := adjust(k, -3, "ops"); res.Err != nil || res.Operation.Shard != 2 {
		t.Errorf("Give(adjust %s -3) = %+v, want success on shard 2", k, res)
	}
	if res := adjust("adj-too-much", -5, "ops"); codeOf(res) != stock.CodeOutOfStock {
		t.Errorf("Give(adjust -5) with 4 in stock = %v, want OUT_OF_STOCK", res.Err)
	}
	if res := adjust("adj-no-approver", 5, ""); codeOf(res) != stock.CodeInvalidArgument {
		t.Errorf("Give(adjust +5) without an approver = %v, want INVALID_ARGUMENT", res.Err)
	}
	if got, want := s.available("give"), []int64{0, 0, 4}; !slices.Equal(got, want) {
		t.Errorf("available after adjusting = %v, want %v", got, want)
	}
	s.balanced("give")
}

// TestAllocator_Reads: GetOperation, GetStock and the ledger as the
// allocator answers them.
func TestAllocator_Reads(t *testing.T) {
	s := newStack(t, []string{"s1"}, "a1")
	ctx := context.Background()
	s.createSKU("reads", 2, 10)
	k := keyFor(t, "op", 2, 1)
	if res := s.alloc.Allocate(ctx, deduct("reads", k, 3)); res.Err != nil {
		t.Fatal(res.Err)
	}

	t.Run("GetOperation", func(t *testing.T) {
		for _, tc := range []struct {
			name, sku, key string
			want           stock.Code
		}{
			{"OK", "reads", k, ""},
			{"NotFound", "reads", "never", stock.CodeOperationNotFound},
			{"OtherSKU", "nosuch", k, stock.CodeOperationNotFound},
			{"NoSKU", "", k, stock.CodeInvalidSKU},
			{"NoKey", "reads", "", stock.CodeInvalidIdempotencyKey},
		} {
			t.Run(tc.name, func(t *testing.T) {
				op, err := s.alloc.GetOperation(ctx, tc.sku, tc.key)
				if codeOfErr(err) != tc.want {
					t.Fatalf("GetOperation(%q, %q) = %v, want %q", tc.sku, tc.key, err, tc.want)
				}
				if err == nil && (op.Kind != stock.OpDeduct || op.Quantity != 3 || op.Shard != 1) {
					t.Errorf("GetOperation(%q, %q) = %+v, want the deduct of 3 on shard 1", tc.sku, tc.key, op)
				}
			})
		}
	})
	t.Run("GetStock", func(t *testing.T) {
		st, err := s.alloc.GetStock(ctx, "reads")
		if err != nil {
			t.Fatal(err)
		}
		if st.Total.Available != 7 || st.Total.Sold != 3 || len(st.Shards) != 2 {
			t.Errorf("GetStock(reads) = %+v, want 7 available and 3 sold over 2 shards", st)
		}
		v := s.alloc.Topology()
		for _, sh := range st.Shards {
			owner, _, _ := v.Owner(stock.PartitionOf("reads", sh.Index))
			if sh.ServerID == "" || sh.ServerID != owner.ID {
				t.Errorf("shard %d served by %q, want its owner %q", sh.Index, sh.ServerID, owner.ID)
			}
		}
		for _, tc := range []struct {
			sku  string
			want stock.Code
		}{{"", stock.CodeInvalidSKU}, {"nosuch", stock.CodeSKUNotFound}} {
			if _, err := s.alloc.GetStock(ctx, tc.sku); codeOfErr(err) != tc.want {
				t.Errorf("GetStock(%q) = %v, want %s", tc.sku, err, tc.want)
			}
		}
	})
	t.Run("Ledger", func(t *testing.T) {
		es, err := s.alloc.ListLedger(ctx, "reads", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range es {
			if e.Kind == stock.OpDeduct && e.IdempotencyKey == k {
				n++
			}
		}
		if n != 1 {
			t.Errorf("ListLedger(reads) has %d entries of the deduct %s, want 1", n, k)
		}
		if _, err := s.alloc.ListLedger(ctx, "nosuch", 0, 100); codeOfErr(err) != stock.CodeSKUNotFound {
			t.Errorf("ListLedger(nosuch) = %v, want SKU_NOT_FOUND", err)
		}
		if _, err := s.alloc.ListTransfers(ctx, stock.TransferFilter{}, "", 100); err != nil {
			t.Errorf("ListTransfers() = %v", err)
		}
		if _, err := s.alloc.ListTransfers(ctx, stock.TransferFilter{SKU: "bad\x00sku"}, "", 100); codeOfErr(err) != stock.CodeInvalidSKU {
			t.Errorf("ListTransfers(bad sku) = %v, want INVALID_SKU", err)
		}
		if _, err := s.alloc.Reconcile(ctx, ""); codeOfErr(err) != stock.CodeInvalidSKU {
			t.Errorf("Reconcile(\"\") = %v, want INVALID_SKU", err)
		}
		s.balanced("reads")
		if !s.alloc.Ready() {
			t.Errorf("Ready() = false with every partition owned")
		}
	})
}

// TestAllocator_Admin: CreateSKU, UpdateSKU and ResumeShard validate
// before they write.
func TestAllocator_Admin(t *testing.T) {
	s := newStack(t, []string{"s1"}, "")
	ctx := context.Background()
	s.createSKU("admin", 2, 4)
	t.Run("Prewarm", func(t *testing.T) { testPrewarm(t, s) })

	t.Run("CreateSKU", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			sku     stock.SKU
			initial int64
			want    stock.Code
		}{
			{"NoName", stock.SKU{}, 1, stock.CodeInvalidSKU},
			{"TooManyShards", stock.SKU{Name: "c1", Shards: stock.ShardsMax + 1}, 1, stock.CodeInvalidArgument},
			{"NegativeStock", stock.SKU{Name: "c2", Shards: 1}, -1, stock.CodeInvalidQuantity},
			{"NegativeMaxPerOrder", stock.SKU{Name: "c3", MaxPerOrder: -1}, 1, stock.CodeInvalidArgument},
			{"TTLTooShort", stock.SKU{Name: "c4", ReservationTTL: time.Millisecond}, 1, stock.CodeInvalidArgument},
			{"Exists", stock.SKU{Name: "admin"}, 1, stock.CodeSKUExists},
			{"OK", stock.SKU{Name: "c5"}, 3, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st, err := s.alloc.CreateSKU(ctx, tc.sku, tc.initial)
				if codeOfErr(err) != tc.want {
					t.Fatalf("CreateSKU(%+v, %d) = %v, want %q", tc.sku, tc.initial, err, tc.want)
				}
				if err == nil && (st.SKU.Shards != 1 || st.Total.Available != tc.initial || st.SKU.Status != stock.StatusActive) {
					t.Errorf("CreateSKU(%+v, %d) = %+v, want one active shard holding %d", tc.sku, tc.initial, st, tc.initial)
				}
			})
		}
		if _, err := s.alloc.GetStock(ctx, "c2"); codeOfErr(err) != stock.CodeSKUNotFound {
			t.Errorf("GetStock(c2) after a refused CreateSKU = %v, want SKU_NOT_FOUND", err)
		}
	})
	t.Run("UpdateSKU", func(t *testing.T) {
		neg, three, yes := int64(-1), int64(3), true
		for _, tc := range []struct {
			name string
			sku  string
			u    stock.SKUUpdate
			want stock.Code
		}{
			{"NoName", "", stock.SKUUpdate{Paused: &yes}, stock.CodeInvalidSKU},
			{"NegativeMaxPerOrder", "admin", stock.SKUUpdate{MaxPerOrder: &neg}, stock.CodeInvalidArgument},
			{"NegativeCustomerLimit", "admin", stock.SKUUpdate{CustomerLimit: &neg}, stock.CodeInvalidArgument},
			{"Unknown", "nosuch", stock.SKUUpdate{Paused: &yes}, stock.CodeSKUNotFound},
			{"OK", "admin", stock.SKUUpdate{MaxPerOrder: &three}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.alloc.UpdateSKU(ctx, tc.sku, tc.u)
				if codeOfErr(err) != tc.want {
					t.Fatalf("UpdateSKU(%q, %+v) = %v, want %q", tc.sku, tc.u, err, tc.want)
				}
				if err == nil && got.MaxPerOrder != 3 {
					t.Errorf("UpdateSKU(%q, %+v) = %+v, want max_per_order 3", tc.sku, tc.u, got)
				}
			})
		}
		// The allocator forgets its cached copy: the new limit words the
		// refusal of a request larger than any shard at once.
		if res := s.alloc.Allocate(ctx, deduct("admin", "upd-4", 4)); codeOf(res) != stock.CodeQuantityAboveMaxPerOrder {
			t.Errorf("Take(deduct 4) after max_per_order 3 = %v, want QUANTITY_ABOVE_MAX_PER_ORDER", res.Err)
		}
	})
	t.Run("ResumeShard", func(t *testing.T) {
		halt(t, s.url, "admin", 1, "ledger mismatch")
		for _, tc := range []struct {
			name             string
			sku              string
			idx              int32
			approver, reason string
			want             stock.Code
		}{
			{"NoSKU", "", 0, "ann", "checked", stock.CodeInvalidSKU},
			{"NegativeIndex", "admin", -1, "ann", "checked", stock.CodeInvalidArgument},
			{"IndexTooLarge", "admin", stock.ShardsMax, "ann", "checked", stock.CodeInvalidArgument},
			{"NoApprover", "admin", 1, "", "checked", stock.CodeInvalidArgument},
			{"BlankApprover", "admin", 1, "  ", "checked", stock.CodeInvalidArgument},
			{"NoReason", "admin", 1, "ann", "", stock.CodeInvalidArgument},
			{"ApproverTooLong", "admin", 1, fmt.Sprintf("%0*d", stock.ApproverLenMax+1, 0), "checked", stock.CodeInvalidArgument},
			{"ReasonTooLong", "admin", 1, "ann", fmt.Sprintf("%0*d", stock.ReasonLenMax+1, 0), stock.CodeInvalidArgument},
			{"NoSuchShard", "admin", 5, "ann", "checked", stock.CodeSKUNotFound},
			{"NotHalted", "admin", 0, "ann", "checked", stock.CodeShardNotHalted},
			{"OK", "admin", 1, "ann", "checked", ""},
			{"Again", "admin", 1, "ann", "checked", stock.CodeShardNotHalted},
		} {
			t.Run(tc.name, func(t *testing.T) {
				was, err := s.alloc.ResumeShard(ctx, stock.ShardKey{SKU: tc.sku, Index: tc.idx}, tc.approver, tc.reason)
				if codeOfErr(err) != tc.want {
					t.Fatalf("ResumeShard(%s#%d, %q, %q) = %v, want %q", tc.sku, tc.idx, tc.approver, tc.reason, err, tc.want)
				}
				if err == nil && was != "ledger mismatch" {
					t.Errorf("ResumeShard(%s#%d) = %q, want the halt's reason", tc.sku, tc.idx, was)
				}
			})
		}
	})
}

// halt marks a shard halted as a shard server does when its row and its
// ledger disagree.
func halt(t *testing.T, url, sku string, idx int32, reason string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE shards SET halted_reason = $3 WHERE sku = $1 AND idx = $2`, sku, idx, reason); err != nil {
		t.Fatal(err)
	}
}
