package shard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// parkedServer is a shard server owning sku's shards whose writers park
// after parkAfter without work and are dropped after idleMax.
func parkedServer(t *testing.T, sku string, shards int32, initial int64, parkAfter, idleMax time.Duration) *shard.Server {
	t.Helper()
	db, _ := openDB(t)
	createSKU(t, db, stock.SKU{Name: sku, Shards: shards}, initial)
	s := newServer(t, db, "a", func(s *shard.Server) { shard.SetWriterIdle(s, parkAfter, idleMax) })
	for i := range shards {
		acquire(t, s, sku, 1, i)
	}
	t.Cleanup(func() { reconcile(t, db, sku) })
	return s
}

// awaitParked waits until k's writer runs no goroutine, and returns it.
func awaitParked(t *testing.T, s *shard.Server, k stock.ShardKey) shard.WriterState {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		st := shard.WriterOf(s, k)
		if st.Exists && !st.Running && st.Goroutines == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("writer of %s = %+v after 5 s without work, want parked", k, st)
		}
	}
}

// TestShard_WriterParks: a writer with nothing to do ends its goroutine
// and stays the shard's writer with its row (parked); the next request
// starts a goroutine of the same writer again. A parked writer idle for
// idleMax is dropped, and the next request gets a new writer.
func TestShard_WriterParks(t *testing.T) {
	const sku = "parks"
	s := parkedServer(t, sku, 2, 100, 20*time.Millisecond, time.Hour)
	ctx := context.Background()
	k := stock.ShardKey{SKU: sku, Index: 0}
	deduct := func(key string) {
		t.Helper()
		if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: k, Quantity: 1, Key: key}); r.Err != nil || r.Replayed {
			t.Fatalf("deduct %s = %+v, want a new success", key, r)
		}
	}
	deduct("p1")
	first := awaitParked(t, s, k)
	if !first.Loaded {
		t.Errorf("parked writer %+v dropped its row, want it kept", first)
	}
	deduct("p2")
	again := awaitParked(t, s, k)
	if again.Writer != first.Writer || !again.Loaded {
		t.Errorf("after a request to a parked writer, the shard's writer = %+v, want the same writer %p again, its row kept", again, first.Writer)
	}
	if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: k, Quantity: 1, Key: "p1"}); r.Err != nil || !r.Replayed {
		t.Errorf("deduct p1 again = %+v, want its first answer, replayed", r)
	}

	// Idle past idleMax: dropped; the next request starts a new writer.
	shard.SetWriterIdleMax(s, 0)
	awaitParked(t, s, k)
	shard.DropIdle(s)
	if st := shard.WriterOf(s, k); st.Exists {
		t.Fatalf("writer of %s after DropIdle past idleMax = %+v, want dropped", k, st)
	}
	deduct("p3")
	if st := awaitParked(t, s, k); st.Writer == first.Writer {
		t.Errorf("after the drop, the shard's writer is the dropped one %p, want a new writer", first.Writer)
	}
}

// TestShard_WriterParksUnderRequests: requests arrive at shard writers
// about when they park (parkAfter 1 ms; each of eight clients sends to a
// shard of its own, 0.5 to 1.5 ms after its last answer, so that no other
// client's request restarts a writer for it): every request is answered
// once, at most one goroutine serves a writer at any moment, and the books
// balance. Seen failing with enqueue starting a goroutine for every
// request (eight goroutines of one writer at once), and with park not
// looking at the queue (a request queued as its writer parked, answered
// SHARD_UNAVAILABLE at the client's deadline).
func TestShard_WriterParksUnderRequests(t *testing.T) {
	const sku = "parkrace"
	const clients, perClient = 8, 200
	s := parkedServer(t, sku, clients, 1_000_000, time.Millisecond, time.Hour)
	var keys []stock.ShardKey
	for i := range int32(clients) {
		keys = append(keys, stock.ShardKey{SKU: sku, Index: i})
	}
	var most atomic.Int32
	var parks atomic.Int64
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, k := range keys {
				st := shard.WriterOf(s, k)
				if st.Goroutines > most.Load() {
					most.Store(st.Goroutines)
				}
				if st.Exists && !st.Running {
					parks.Add(1)
				}
			}
			time.Sleep(50 * time.Microsecond)
		}
	})
	var ok atomic.Int64
	deductsNearParks(t, s, keys, perClient, func(c, i int, r stock.Result) bool {
		if r.Err != nil || r.Replayed {
			t.Errorf("client %d request %d = %+v, want a new success", c, i, r)
			return false
		}
		ok.Add(1)
		return true
	})
	close(stop)
	watch.Wait()
	if most.Load() > 1 {
		t.Errorf("%d goroutines served one writer at once, want at most 1", most.Load())
	}
	if parks.Load() == 0 {
		t.Errorf("no writer was seen parked during the requests: the test exercised no resume")
	}
	if ok.Load() != clients*perClient {
		t.Errorf("%d requests answered, want %d", ok.Load(), clients*perClient)
	}
	t.Logf("%d requests; writers seen parked %d times", ok.Load(), parks.Load())
}

// TestShard_ParkedWriterLosesPartition: a parked writer whose partition is
// lost goes with it, and once the partition is taken back at a new epoch
// the next request gets a new writer. Seen failing with Lose skipping
// parked writers: the epoch-1 writer served at epoch 2.
func TestShard_ParkedWriterLosesPartition(t *testing.T) {
	const sku = "parklose"
	s := parkedServer(t, sku, 1, 100, 10*time.Millisecond, time.Hour)
	ctx := context.Background()
	k := stock.ShardKey{SKU: sku, Index: 0}
	do := func(key string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: k, Quantity: 1, Key: key})
	}
	if r := do("a"); r.Err != nil {
		t.Fatalf("deduct a = %+v", r)
	}
	first := awaitParked(t, s, k)
	s.Lose(k.Partition())
	if st := shard.WriterOf(s, k); st.Exists {
		t.Fatalf("after Lose the parked writer is still the shard's: %+v", st)
	}
	if r := do("b"); r.Err == nil {
		t.Fatalf("deduct b after Lose = %+v, want refused", r)
	}
	acquire(t, s, sku, 2, 0)
	if r := do("c"); r.Err != nil || r.Replayed {
		t.Fatalf("deduct c after Acquire at epoch 2 = %+v, want a new success", r)
	}
	if st := awaitParked(t, s, k); st.Writer == first.Writer {
		t.Errorf("the epoch-1 parked writer served at epoch 2")
	}
}

// TestShard_WriterParksBetweenHolds: reservations made by a writer that
// parks between them are committed and released by it after more parks
// (what it knows of its holds, and its checkpoint count, carried across);
// the books balance.
func TestShard_WriterParksBetweenHolds(t *testing.T) {
	const sku = "parkheld"
	s := parkedServer(t, sku, 1, 1000, 2*time.Millisecond, time.Hour)
	ctx := context.Background()
	k := stock.ShardKey{SKU: sku, Index: 0}
	var ids []string
	for i := range 150 {
		r := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: k, Quantity: 1, Key: key("r", i)})
		if r.Err != nil {
			t.Fatalf("reserve %d = %+v", i, r)
		}
		ids = append(ids, r.Reservation.ID)
		if i%10 == 0 {
			awaitParked(t, s, k)
		}
	}
	for i, id := range ids {
		kind := stock.OpCommit
		if i%2 == 1 {
			kind = stock.OpRelease
		}
		if r := s.Do(ctx, &stock.Request{Kind: kind, Shard: k, ReservationID: id}); r.Err != nil {
			t.Fatalf("%v %s = %+v", kind, id, r)
		}
		if i%7 == 0 {
			awaitParked(t, s, k)
		}
	}
}

// TestShard_WriterParksUnderLossAndDrops: requests at parking writers
// (parkAfter 1 ms) while their partitions are lost and taken back at new
// epochs and idle writers are dropped (idleMax 0) at random moments: every
// request answered before its deadline (served, or refused while its
// partition is away), at most one goroutine per writer, the books
// balanced. Seen failing with dropIdle dropping running writers (two
// writers of one shard: a data race under -race, the books off).
func TestShard_WriterParksUnderLossAndDrops(t *testing.T) {
	const sku = "parkstress"
	const clients, perClient = 8, 250
	s := parkedServer(t, sku, clients, 1_000_000, time.Millisecond, 0)
	var keys []stock.ShardKey
	for i := range int32(clients) {
		keys = append(keys, stock.ShardKey{SKU: sku, Index: i})
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	var most atomic.Int32
	bg.Go(func() {
		epoch := int64(1)
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
			k := keys[rng.IntN(clients)]
			switch rng.IntN(3) {
			case 0:
				epoch++
				if err := s.Acquire(context.Background(), k.Partition(), epoch); err != nil {
					t.Errorf("Acquire(%d, %d) = %v", k.Partition(), epoch, err)
				}
			case 1:
				shard.DropIdle(s)
			case 2:
				for _, k := range keys {
					if st := shard.WriterOf(s, k); st.Goroutines > most.Load() {
						most.Store(st.Goroutines)
					}
				}
			}
		}
	})
	var ok, refused atomic.Int64
	deductsNearParks(t, s, keys, perClient, func(c, i int, r stock.Result) bool {
		switch {
		case r.Err == nil:
			ok.Add(1)
		case strings.Contains(r.Err.Error(), "deadline"):
			t.Errorf("client %d request %d unanswered: %v", c, i, r.Err)
			return false
		default:
			refused.Add(1)
		}
		return true
	})
	close(stop)
	bg.Wait()
	if most.Load() > 1 {
		t.Errorf("%d goroutines served one writer at once, want at most 1", most.Load())
	}
	if ok.Load() == 0 {
		t.Errorf("no request served")
	}
	t.Logf("%d served, %d refused while their partition was away", ok.Load(), refused.Load())
}

// deductsNearParks runs a client for each of keys, each sending perClient
// deducts of one unit to its shard alone, 0.5 to 1.5 ms after its last
// answer (about when a writer parking after 1 ms parks), each within 5 s;
// answered gets every answer and says whether the client goes on.
func deductsNearParks(t *testing.T, s *shard.Server, keys []stock.ShardKey, perClient int, answered func(c, i int, r stock.Result) bool) {
	t.Helper()
	parallel(t, len(keys), 60*time.Second, func(c int) {
		rng := rand.New(rand.NewPCG(uint64(c), 7))
		for i := range perClient {
			time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Microsecond)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: keys[c], Quantity: 1, Key: fmt.Sprintf("c%d-%d", c, i)})
			cancel()
			if !answered(c, i, r) {
				return
			}
		}
	})
}
