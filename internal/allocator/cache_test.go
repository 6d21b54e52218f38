package allocator

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// openDB returns a migrated database of the test's own.
func openDB(t *testing.T) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), pgtest.NewMigratedDB(t), postgres.Options{MaxConns: 4, ApplicationName: "allocatortest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// withoutDB is the Config of an allocator with no database and no shard
// servers, for tests of its memory alone (its rebalancer then runs no
// rounds, which read the database).
func withoutDB() Config {
	return Config{Topology: func() topology.View { return topology.View{} }}
}

// TestAllocator_CacheBounds: the hints hold at most hintsSKUsMax SKUs and
// the SKU cache skuCacheLenMax entries; the least recently used goes first.
func TestAllocator_CacheBounds(t *testing.T) {
	t.Run("Hints", func(t *testing.T) {
		a := New(withoutDB())
		defer a.Close()
		// Every SKU gets hints for shards 0 and 3 (1 and 2 stay unknown).
		key := func(i, idx int) stock.ShardKey { return stock.ShardKey{SKU: fmt.Sprint("h", i), Index: int32(idx)} }
		for i := range hintsSKUsMax + 1 {
			a.setHint(key(i, 3), known(int64(i)))
			a.setHint(key(i, 0), known(int64(i)+1))
		}
		if n := a.hints.Len(); n != hintsSKUsMax {
			t.Errorf("hints.Len() = %d after %d SKUs, want %d", n, hintsSKUsMax+1, hintsSKUsMax)
		}
		if h := a.hintsOf(key(0, 0).SKU, 4); h[0].known || h[3].known {
			t.Errorf("hintsOf(%s) = %+v, want it evicted (unknown)", key(0, 0).SKU, h)
		}
		last := hintsSKUsMax
		h := a.hintsOf(key(last, 0).SKU, 5)
		want := []hint{{available: int64(last) + 1, known: true}, {}, {}, {available: int64(last), known: true}, {}}
		if fmt.Sprint(h) != fmt.Sprint(want) {
			t.Errorf("hintsOf(%s, 5) = %+v, want %+v: the newest SKU's hints kept, by index", key(last, 0).SKU, h, want)
		}
		// A hint of a higher index than any before grows the SKU's entry.
		a.setHint(key(last, 7), known(70))
		if h := a.hintsOf(key(last, 0).SKU, 8); !h[7].known || h[7].available != 70 || h[0].available != int64(last)+1 {
			t.Errorf("hintsOf after a hint for shard 7 = %+v", h)
		}
	})
	t.Run("SKUs", func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		s := stock.SKU{Name: "cached", Status: stock.StatusActive, Shards: 1, ReservationTTL: stock.ReservationTTLDefault}
		if err := db.CreateSKU(ctx, s, 0); err != nil {
			t.Fatal(err)
		}
		a := New(Config{DB: db, Topology: func() topology.View { return topology.View{} }})
		defer a.Close()
		for i := range skuCacheLenMax {
			a.skus.Add(fmt.Sprint("filler-", i), &cachedSKU{sku: &stock.SKU{}, fetched: time.Now()})
		}
		if _, err := a.sku(ctx, s.Name); err != nil {
			t.Fatalf("sku(%s) = %v", s.Name, err)
		}
		if n := a.skus.Len(); n != skuCacheLenMax {
			t.Errorf("skus.Len() = %d, want %d", n, skuCacheLenMax)
		}
		if a.skus.Contains("filler-0") {
			t.Errorf("skus holds filler-0, the least recently used, want it evicted")
		}
		if !a.skus.Contains(s.Name) {
			t.Errorf("skus does not hold %s, just read", s.Name)
		}
	})
}

// TestAllocator_RetryWaitEndsWithContext: a request that waits for
// unreachable shards between rounds returns as soon as its context ends,
// not when the wait is over.
func TestAllocator_RetryWaitEndsWithContext(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	s := stock.SKU{Name: "unreachable", Status: stock.StatusActive, Shards: 2, ReservationTTL: stock.ReservationTTLDefault}
	if err := db.CreateSKU(ctx, s, 10); err != nil {
		t.Fatal(err)
	}
	// No shard server owns anything: the stock exists but cannot be
	// reached, which is not a sold-out, so the request waits and retries.
	a := New(Config{DB: db, Topology: func() topology.View { return topology.View{} }})
	defer a.Close()
	a.transitWait = time.Hour

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan stock.Result, 1)
	start := time.Now()
	go func() {
		done <- a.Allocate(rctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: s.Name}, Quantity: 1, Key: "k"})
	}()
	// The request reaches the wait: its first sold-out check has run.
	waitFor(t, func() bool {
		h := a.hintsOf(s.Name, s.Shards)
		return h[0].known && h[1].known
	})
	cancel()
	select {
	case res := <-done:
		if res.Err == nil || res.Err.Code != stock.CodeShardUnavailable {
			t.Errorf("Take after its context ended = %+v, want SHARD_UNAVAILABLE", res)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Take returned %s after it started, want at once when its context ended", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Take still waits 10s after its context ended")
	}
}

// TestAllocator_FirstHintsAtOnce: the first hints of one SKU's shards, set
// at once, all land in one entry; none is lost to a second entry.
func TestAllocator_FirstHintsAtOnce(t *testing.T) {
	a := New(withoutDB())
	defer a.Close()
	const shards = 64
	for round := range 500 {
		sku := fmt.Sprint("race-", round)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range shards {
			wg.Go(func() {
				<-start
				a.setHint(stock.ShardKey{SKU: sku, Index: int32(i)}, known(int64(i)+1))
			})
		}
		close(start)
		wg.Wait()
		for i, h := range a.hintsOf(sku, shards) {
			if !h.known || h.available != int64(i)+1 {
				t.Fatalf("%s: shard %d's hint %+v after every shard's first hint at once, want %d known", sku, i, h, i+1)
			}
		}
	}
}

// gatedStore is a real database whose next GetSKU, once held, waits after
// its read until released: a read of a SKU that overlaps a change of it.
type gatedStore struct {
	*postgres.DB
	hold    atomic.Bool
	read    chan struct{} // a held GetSKU has read
	release chan struct{} // closed: it returns
}

func (g *gatedStore) GetSKU(ctx context.Context, name string) (*stock.SKU, error) {
	s, err := g.DB.GetSKU(ctx, name)
	if g.hold.CompareAndSwap(true, false) {
		g.read <- struct{}{}
		<-g.release
	}
	return s, err
}

// TestAllocator_SKUCacheFillAfterForget: a read of a SKU that began before
// this allocator changed it (UpdateSKU) and ends after answers its caller
// but is not cached: the next request reads the change, not the copy from
// before it for skuCacheTTL.
func TestAllocator_SKUCacheFillAfterForget(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	s := stock.SKU{Name: "refilled", Status: stock.StatusActive, Shards: 1, ReservationTTL: stock.ReservationTTLDefault}
	if err := db.CreateSKU(ctx, s, 0); err != nil {
		t.Fatal(err)
	}
	g := &gatedStore{DB: db, read: make(chan struct{}), release: make(chan struct{})}
	a := New(Config{DB: g, Topology: func() topology.View { return topology.View{} }})
	defer a.Close()
	g.hold.Store(true)
	type answer struct {
		sku *stock.SKU
		err error
	}
	first := make(chan answer, 1)
	go func() {
		s, err := a.sku(ctx, s.Name)
		first <- answer{s, err}
	}()
	select {
	case <-g.read: // the read has the SKU active, and has not returned
	case <-time.After(10 * time.Second):
		t.Fatal("sku(refilled) did not read within 10 s")
	}
	paused := true
	if _, err := a.UpdateSKU(ctx, s.Name, stock.SKUUpdate{Paused: &paused}); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if got := <-first; got.err != nil || got.sku.Status != stock.StatusActive {
		t.Fatalf("sku(refilled) read before the pause = %+v, %v, want it active", got.sku, got.err)
	}
	got, err := a.sku(ctx, s.Name)
	if err != nil || got.Status != stock.StatusPaused {
		t.Errorf("sku(refilled) after UpdateSKU paused it = %+v, %v, want it paused: a read from before the change was cached", got, err)
	}
}

// countingStore is a real database that counts its GetSKU calls.
type countingStore struct {
	*postgres.DB
	reads atomic.Int64
}

func (c *countingStore) GetSKU(ctx context.Context, name string) (*stock.SKU, error) {
	c.reads.Add(1)
	return c.DB.GetSKU(ctx, name)
}

// TestAllocator_SKUCacheFromGetStock: the SKU GetStock reads (CreateSKU
// answers with it) is cached for routing: the SKU's first request reads
// no configuration.
func TestAllocator_SKUCacheFromGetStock(t *testing.T) {
	db := &countingStore{DB: openDB(t)}
	ctx := context.Background()
	a := New(Config{DB: db, Topology: func() topology.View { return topology.View{} }, Rebalance: quietRounds})
	defer a.Close()
	s := stock.SKU{Name: "fresh", Status: stock.StatusActive, Shards: 2, ReservationTTL: stock.ReservationTTLDefault}
	if _, err := a.CreateSKU(ctx, s, 10); err != nil {
		t.Fatal(err)
	}
	before := db.reads.Load()
	got, err := a.sku(ctx, s.Name)
	if err != nil || got.Shards != 2 {
		t.Fatalf("sku(%s) = %+v, %v, want its 2 shards", s.Name, got, err)
	}
	if n := db.reads.Load() - before; n != 0 {
		t.Errorf("sku(%s) after CreateSKU read the SKU %d times, want 0: GetStock's read cached", s.Name, n)
	}
}

// unbatched hides the database's GetSKUs (a method of another signature),
// so that the allocator starts no refreshes of its own: the test runs one
// (refreshDue) when it chooses.
type unbatched struct{ *countingStore }

func (unbatched) GetSKUs() {}

// TestAllocator_SKURefresh: a refresh reads again, in one statement, the
// SKUs asked for since their read once past half their TTL, and no
// other: the next request of a refreshed SKU reads nothing, and sees a
// change made through another allocator before the refresh.
func TestAllocator_SKURefresh(t *testing.T) {
	db := &countingStore{DB: openDB(t)}
	ctx := context.Background()
	a := New(Config{DB: unbatched{db}, Topology: func() topology.View { return topology.View{} }, Rebalance: quietRounds})
	defer a.Close()
	for _, name := range []string{"asked", "idle", "young"} {
		if err := db.CreateSKU(ctx, stock.SKU{Name: name, Status: stock.StatusActive, Shards: 1, ReservationTTL: stock.ReservationTTLDefault}, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := a.sku(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-skuCacheTTL * 3 / 4)
	for _, name := range []string{"asked", "idle"} {
		c, _ := a.skus.Peek(name)
		a.skus.Add(name, &cachedSKU{sku: c.sku, fetched: old})
	}
	for _, name := range []string{"asked", "young"} {
		if _, err := a.sku(ctx, name); err != nil { // asked for since its read
			t.Fatal(err)
		}
	}
	paused := true
	if _, err := db.UpdateSKU(ctx, "asked", stock.SKUUpdate{Paused: &paused}); err != nil { // as another allocator would
		t.Fatal(err)
	}
	entries := map[string]*cachedSKU{}
	for _, name := range []string{"asked", "idle", "young"} {
		entries[name], _ = a.skus.Peek(name)
	}
	before := db.reads.Load()
	a.refreshDue(db)
	for name, want := range map[string]bool{"asked": true, "idle": false, "young": false} {
		if c, _ := a.skus.Peek(name); (c != entries[name]) != want {
			t.Errorf("%s refreshed %v, want %v", name, c != entries[name], want)
		}
	}
	got, err := a.sku(ctx, "asked")
	if err != nil || got.Status != stock.StatusPaused {
		t.Errorf("sku(asked) after the refresh = %+v, %v, want it paused", got, err)
	}
	if n := db.reads.Load() - before; n != 0 {
		t.Errorf("%d GetSKU calls for the refresh and the next request, want 0", n)
	}
}

// forgetDuring is a batch reader that has the allocator forget a SKU
// (UpdateSKU through it) after its read and before it returns.
type forgetDuring struct {
	*postgres.DB
	a    *Allocator
	name string
}

func (f forgetDuring) GetSKUs(ctx context.Context, names []string) (map[string]*stock.SKU, error) {
	got, err := f.DB.GetSKUs(ctx, names)
	f.a.forgetSKU(f.name)
	return got, err
}

// TestAllocator_SKURefreshAfterForget: a refresh whose read a forget of
// the SKU overlapped does not cache what it read, as readSKU does not.
func TestAllocator_SKURefreshAfterForget(t *testing.T) {
	db := &countingStore{DB: openDB(t)}
	ctx := context.Background()
	a := New(Config{DB: unbatched{db}, Topology: func() topology.View { return topology.View{} }, Rebalance: quietRounds})
	defer a.Close()
	if err := db.CreateSKU(ctx, stock.SKU{Name: "changed", Status: stock.StatusActive, Shards: 1, ReservationTTL: stock.ReservationTTLDefault}, 1); err != nil {
		t.Fatal(err)
	}
	c := &cachedSKU{sku: &stock.SKU{Name: "changed"}, fetched: time.Now().Add(-skuCacheTTL * 3 / 4)}
	c.used.Store(true)
	a.skus.Add("changed", c)
	a.refreshDue(forgetDuring{DB: db.DB, a: a, name: "changed"})
	if got, ok := a.skus.Peek("changed"); ok {
		t.Errorf("after a refresh a forget overlapped, the cache holds %+v, want nothing", got.sku)
	}
}

// quietRounds keeps the rebalancer's rounds, which read SKUs, out of the
// tests that count the SKU cache's reads.
var quietRounds = rebalance.Config{Interval: time.Hour}
