package shard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestShard_ZombieFenced: two servers race for one partition. After the
// second takes it over, the first (which still believes it owns it) cannot
// commit a batch, and the database shows it.
func TestShard_ZombieFenced(t *testing.T) {
	db, _ := openDB(t)
	const sku = "zombie-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1}, 100_000)
	a, b := newServer(t, db, "a"), newServer(t, db, "b")
	acquire(t, a, sku, 1, 0)
	sh := stock.ShardKey{SKU: sku}
	ctx := context.Background()

	// Load on the old owner; the takeover lands in the middle of it.
	var acked sync.Map // key -> server that acknowledged it
	var n atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := key("z", g*10000+i)
				srv := a
				if n.Add(1)%2 == 0 {
					srv = b
				}
				if res := srv.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: k}); res.Err == nil {
					acked.Store(k, srv.ID())
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	acquire(t, b, sku, 2, 0) // a is not told: it is the zombie
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	// The zombie's writes after the takeover are refused.
	if res := a.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "after"}); res.Err == nil {
		t.Errorf("zombie Deduct = %+v, want SHARD_UNAVAILABLE", res)
	}
	es := ledgerEntries(t, db, sku)
	var lastA, firstB int64 = 0, 1 << 62
	var byA, byB int
	for _, e := range es {
		switch e.ServerID {
		case "a":
			byA++
			lastA = max(lastA, e.ID)
			if e.Epoch != 1 {
				t.Errorf("entry %d by a at epoch %d, want 1", e.ID, e.Epoch)
			}
		case "b":
			byB++
			firstB = min(firstB, e.ID)
			if e.Epoch != 2 {
				t.Errorf("entry %d by b at epoch %d, want 2", e.ID, e.Epoch)
			}
		}
	}
	if byA == 0 || byB == 0 {
		t.Fatalf("entries by a = %d, by b = %d: the race did not happen", byA, byB)
	}
	if lastA > firstB {
		t.Errorf("a wrote entry %d after b's first entry %d: the zombie committed after the takeover", lastA, firstB)
	}
	ackedN := 0
	acked.Range(func(k, _ any) bool {
		ackedN++
		if _, err := db.GetOperation(ctx, sku, k.(string)); err != nil {
			t.Errorf("acknowledged key %s: %v", k, err)
		}
		return true
	})
	if c := total(t, db, sku); c.Sold != int64(ackedN) || c.Sold != int64(len(es)) {
		t.Errorf("sold = %d, acknowledged = %d, entries = %d: want all equal", c.Sold, ackedN, len(es))
	}
	reconcile(t, db, sku)
}

// TestShard_BackendTerminated: Postgres backends are killed mid-batch while
// deducts run. Callers retry with the same key until a definite answer; no
// acknowledged operation is lost and none is doubled.
func TestShard_BackendTerminated(t *testing.T) {
	db, url := openDB(t)
	const sku = "kill-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 4}, 1_000_000)
	reg := prometheus.NewRegistry()
	s := newServerWith(t, shard.Config{ServerID: "a", DB: db, Logger: testLogger(), Registerer: reg})
	acquire(t, s, sku, 1, 0, 1, 2, 3)
	ctx := context.Background()

	// The clients go on until kills have hit batches, within bounds: a
	// group is one round trip (speculative), so a backend is busy for well
	// under a millisecond at a time, and a fixed count of deducts could be
	// over before the killer hit one. The killer goes on for killMin, and
	// then until its kills have hit enough batches (or the load's
	// deadline), so that the clients' last requests and their retries end
	// soon after it: a killer going on until every client was done made
	// each of their retries fail again (over a minute on 2 cores).
	const clients, perClientMin, perClientMax = 16, 40, 20_000
	const killsWanted, hitsWanted, loadMax, killMin = 10, 5, 20 * time.Second, 3 * time.Second
	acked := make([]bool, clients*perClientMax)
	issued := make([]bool, clients*perClientMax)
	killUntil, deadline := time.Now().Add(killMin), time.Now().Add(loadMax)
	var kills, unavailable, reruns atomic.Int64
	enough := func() bool {
		return kills.Load() >= killsWanted && unavailable.Load()+reruns.Load() >= hitsWanted
	}

	killer, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close(ctx)
	stop := make(chan struct{})
	killerDone := make(chan struct{})
	// A kill hits a batch when the batch's group fails on it: the batch
	// is rerun (its group did not commit) or answered retryably (whether
	// it committed is not known).
	go func() {
		defer close(killerDone)
		for (time.Now().Before(killUntil) || !enough()) && time.Now().Before(deadline) {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
			var n int64
			// Terminate the shard server's busiest connections (not this one).
			if err := killer.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name = 'shardtest' AND datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`).Scan(&n); err == nil {
				kills.Add(n)
			}
			reruns.Store(int64(counterValue(reg, "shardstock_shard_batch_reruns_total", "cause", "not_committed")))
		}
	}()

	parallel(t, clients, 90*time.Second, func(g int) {
		for i := 0; i < perClientMax && time.Now().Before(deadline) &&
			(i < perClientMin || !enough()); i++ {
			n := g*perClientMax + i
			issued[n] = true
			r := &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: int32(n % 4)}, Quantity: 1, Key: key("kill", n)}
			for attempt := 0; attempt < 100; attempt++ {
				res := s.Do(ctx, r)
				if res.Err == nil {
					acked[n] = true
					break
				}
				if !res.Err.Code.Retryable() {
					t.Errorf("Deduct(%s) = %v, want success or a retryable error", r.Key, res.Err)
					break
				}
				unavailable.Add(1)
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	close(stop)
	<-killerDone
	// Whether the kills hit anything is checked last: a loss they caused
	// must be reported even if no answer showed them.
	defer func() {
		if hits := unavailable.Load() + reruns.Load(); kills.Load() == 0 || hits == 0 {
			t.Errorf("backends terminated: %d, batches hit: %d: the test tested nothing", kills.Load(), hits)
		}
	}()
	reruns.Store(int64(counterValue(reg, "shardstock_shard_batch_reruns_total", "cause", "not_committed")))
	t.Logf("backends terminated: %d; batches hit: %d answered retryably, %d rerun (not committed)", kills.Load(), unavailable.Load(), reruns.Load())

	ackedN := 0
	for n, ok := range acked {
		if !issued[n] {
			continue
		}
		if !ok {
			t.Errorf("key %s never got a definite answer", key("kill", n))
			continue
		}
		ackedN++
	}
	es := ledgerEntries(t, db, sku)
	perKey := map[string]int{}
	for _, e := range es {
		perKey[e.IdempotencyKey]++
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s has %d ledger entries, want 1", k, n)
		}
	}
	if c := total(t, db, sku); c.Sold != int64(ackedN) || len(es) != ackedN {
		t.Errorf("sold = %d, entries = %d, acknowledged = %d: want all equal", c.Sold, len(es), ackedN)
	}
	reconcile(t, db, sku)
}
