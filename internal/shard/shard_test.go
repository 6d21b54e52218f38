package shard_test

import (
	"context"
	"testing"
	"time"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestShard_SourceCase is the source document's case: 100 units on 8 shards
// over two shard servers, 500 concurrent deducts of 1, 50 of them reusing
// another request's key.
func TestShard_SourceCase(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, _ := openDB(t)
	const sku = "case-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 8}, 100)
	a, b := newServer(t, db, "a"), newServer(t, db, "b")
	ca, cb := serve(t, a), serve(t, b)
	r := &router{shards: 8, clients: map[int32]shardstockv1connect.ShardServiceClient{}}
	for i := int32(0); i < 8; i++ {
		if i%2 == 0 {
			acquire(t, a, sku, 1, i)
			r.clients[i] = ca
		} else {
			acquire(t, b, sku, 1, i)
			r.clients[i] = cb
		}
	}

	// Requests 450..499 reuse the key of request i-450.
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = key("order", i)
		if i >= 450 {
			keys[i] = keys[i-450]
		}
	}
	results := make([]*v1.ShardResult, len(keys))
	ctx := context.Background()
	parallel(t, len(keys), 60*time.Second, func(i int) {
		res, err := r.do(ctx, &v1.ShardOp{Kind: v1.ShardOpKind_SHARD_OP_KIND_DEDUCT, Sku: sku, Quantity: 1, IdempotencyKey: keys[i]})
		if err != nil {
			t.Errorf("deduct %s: %v", keys[i], err)
			return
		}
		results[i] = res
	})
	if t.Failed() {
		t.FailNow()
	}

	firsts := map[string]int{}
	for i, res := range results {
		if res.GetError() == nil && !res.Replayed {
			firsts[keys[i]]++
		}
	}
	if len(firsts) != 100 {
		t.Errorf("distinct keys that succeeded = %d, want 100", len(firsts))
	}
	for k, n := range firsts {
		if n != 1 {
			t.Errorf("key %s succeeded %d times without replay, want 1", k, n)
		}
	}
	for i := 450; i < 500; i++ {
		orig, dup := results[i-450], results[i]
		if (orig.GetError() == nil) != (dup.GetError() == nil) {
			t.Errorf("key %s: results %v and %v disagree", keys[i], orig, dup)
			continue
		}
		if orig.GetError() != nil {
			if orig.GetError().Reason != dup.GetError().Reason {
				t.Errorf("key %s: errors %v and %v disagree", keys[i], orig.GetError(), dup.GetError())
			}
			continue
		}
		if orig.Replayed == dup.Replayed {
			t.Errorf("key %s: replayed = %v and %v, want exactly one replay", keys[i], orig.Replayed, dup.Replayed)
		}
		if o, d := orig.GetOperation(), dup.GetOperation(); o.Shard != d.Shard || o.Quantity != d.Quantity || !o.CreatedAt.AsTime().Equal(d.CreatedAt.AsTime()) {
			t.Errorf("key %s: replay %v is not the original %v", keys[i], d, o)
		}
	}
	if got := total(t, db, sku); got != (stock.Counts{Available: 0, Sold: 100}) {
		t.Errorf("total = %+v, want available 0, sold 100", got)
	}
	if n := countKind(ledgerEntries(t, db, sku), stock.OpDeduct); n != 100 {
		t.Errorf("deduct ledger entries = %d, want 100", n)
	}
	reconcile(t, db, sku)
}

// TestShard_ReleaseRacesSweeper: reservations released by two callers at once
// while the sweeper expires them return their stock once. The releases are
// spread from before each reservation's expiry to past the next sweep, so
// some end it first and the sweeper ends the others under them; the test
// first proves both happened, then checks that every reservation ended once.
func TestShard_ReleaseRacesSweeper(t *testing.T) {
	db, _ := openDB(t)
	const sku = "race-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1}, 1000)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0)
	ctx := context.Background()

	const n = 40
	holds := make([]*stock.Reservation, n)
	for i := range holds {
		res := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: sku}, Quantity: 3, Key: key("hold", i), TTL: time.Second})
		if res.Err != nil {
			t.Fatalf("Reserve = %v", res.Err)
		}
		holds[i] = res.Reservation
	}
	// Reservation i is released at raceFrom + i*raceStep after its expiry:
	// the window is longer than a sweep interval (500 ms), so a sweep lands
	// inside it whenever it ticks.
	const raceFrom, raceStep = -300 * time.Millisecond, 40 * time.Millisecond
	got := make([]stock.Result, 2*n)
	parallel(t, 2*n, 30*time.Second, func(i int) {
		h := holds[i/2]
		time.Sleep(time.Until(h.ExpiresAt.Add(raceFrom + time.Duration(i/2)*raceStep)))
		got[i] = s.Do(ctx, &stock.Request{Kind: stock.OpRelease, Shard: stock.ShardKey{SKU: sku}, ReservationID: h.ID, Reason: "cancel"})
	})
	for i, res := range got {
		if res.Err != nil {
			t.Fatalf("Release(%s) = %v", holds[i/2].ID, res.Err)
		}
	}
	// Let the sweeper finish whatever the releases did not.
	deadline := time.Now().Add(5 * time.Second)
	for total(t, db, sku).Reserved != 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	es := ledgerEntries(t, db, sku)
	ends := map[string][]*stock.LedgerEntry{} // reservation -> its release and expire entries
	for _, e := range es {
		if e.Kind == stock.OpRelease || e.Kind == stock.OpExpire {
			ends[e.ReservationID] = append(ends[e.ReservationID], e)
		}
	}

	// The race: the sweeper expired some reservations under their releases
	// (both releases lost and report the expiry), and releases ended others
	// before the sweeper reached them (the sweeper lost).
	var sweeperWon, releaseWon int
	for i, h := range holds {
		if len(ends[h.ID]) == 0 {
			continue // reported below
		}
		a, b := got[2*i], got[2*i+1]
		switch e := ends[h.ID][0]; {
		case e.Kind == stock.OpExpire && e.Source == stock.SourceSweeper:
			if !a.Replayed || !b.Replayed || a.Reservation.State != stock.ReservationExpired || b.Reservation.State != stock.ReservationExpired {
				t.Errorf("reservation %s: the sweeper expired it, but releases = (replayed %v, %s), (replayed %v, %s); want both replayed, expired",
					h.ID, a.Replayed, a.Reservation.State, b.Replayed, b.Reservation.State)
			}
			sweeperWon++
		default:
			releaseWon++
		}
	}
	t.Logf("ended by the sweeper under their releases: %d; ended by a release first: %d", sweeperWon, releaseWon)
	if sweeperWon == 0 || releaseWon == 0 {
		t.Fatalf("ended by the sweeper = %d, by a release = %d: the race did not happen", sweeperWon, releaseWon)
	}

	// The outcome: every reservation ended once, by one of them.
	for i, h := range holds {
		if es := ends[h.ID]; len(es) != 1 {
			t.Errorf("reservation %s: %d release and expire entries, want 1", h.ID, len(es))
		}
		if a, b := got[2*i], got[2*i+1]; !a.Replayed && !b.Replayed {
			t.Errorf("reservation %s: both releases claim to have released it", h.ID)
		}
	}
	if c := total(t, db, sku); c != (stock.Counts{Available: 1000}) {
		t.Errorf("total = %+v, want every unit back once: available 1000", c)
	}
	reconcile(t, db, sku)
}

// TestShard_ReservationEnds covers every way a reservation can end twice.
func TestShard_ReservationEnds(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, _ := openDB(t)
	const sku = "ends-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1}, 100)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0)
	ctx := context.Background()
	sh := stock.ShardKey{SKU: sku}
	reserve := func(k string, ttl time.Duration) string {
		t.Helper()
		res := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: sh, Quantity: 2, Key: k, TTL: ttl})
		if res.Err != nil {
			t.Fatalf("Reserve(%s) = %v", k, res.Err)
		}
		return res.Reservation.ID
	}
	end := func(kind stock.OpKind, id string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: kind, Shard: sh, ReservationID: id, Reason: "test"})
	}
	expectErr := func(name string, res stock.Result, code stock.Code) {
		t.Helper()
		before := total(t, db, sku)
		if res.Err == nil || res.Err.Code != code {
			t.Errorf("%s = %+v, want %s", name, res, code)
		}
		if after := total(t, db, sku); after != before {
			t.Errorf("%s changed stock: %+v -> %+v", name, before, after)
		}
	}

	t.Run("CommitAfterExpiry", func(t *testing.T) {
		id := reserve("exp-1", time.Second)
		time.Sleep(1100 * time.Millisecond)
		expectErr("Commit after expiry", end(stock.OpCommit, id), stock.CodeReservationExpired)
		expectErr("Commit after expiry again", end(stock.OpCommit, id), stock.CodeReservationExpired)
	})
	t.Run("ReleaseAfterCommit", func(t *testing.T) {
		id := reserve("com-1", time.Minute)
		if res := end(stock.OpCommit, id); res.Err != nil || res.Replayed || res.Reservation.State != stock.ReservationCommitted {
			t.Fatalf("Commit = %+v, want committed", res)
		}
		expectErr("Release after Commit", end(stock.OpRelease, id), stock.CodeReservationAlreadyCommitted)
		before := total(t, db, sku)
		if res := end(stock.OpCommit, id); res.Err != nil || !res.Replayed {
			t.Errorf("second Commit = %+v, want a replay", res)
		}
		if after := total(t, db, sku); after != before {
			t.Errorf("second Commit changed stock: %+v -> %+v", before, after)
		}
	})
	t.Run("CommitAfterRelease", func(t *testing.T) {
		id := reserve("rel-1", time.Minute)
		if res := end(stock.OpRelease, id); res.Err != nil || res.Reservation.State != stock.ReservationReleased {
			t.Fatalf("Release = %+v, want released", res)
		}
		expectErr("Commit after Release", end(stock.OpCommit, id), stock.CodeReservationAlreadyReleased)
		if res := end(stock.OpRelease, id); res.Err != nil || !res.Replayed {
			t.Errorf("second Release = %+v, want a replay", res)
		}
	})
	t.Run("UnknownReservation", func(t *testing.T) {
		id := stock.NewReservationID(sh)
		expectErr("Commit of an unknown reservation", end(stock.OpCommit, id), stock.CodeReservationNotFound)
	})
	// 3 reservations of 2: one expired, one committed, one released.
	if c := total(t, db, sku); c != (stock.Counts{Available: 98, Sold: 2}) {
		t.Errorf("total = %+v, want available 98, sold 2", c)
	}
	reconcile(t, db, sku)
}
