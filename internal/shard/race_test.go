package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestShard_KeyRacesAcrossShards: one key sent at once to different shards,
// owned by different servers: one shard's batch takes the key, the others
// conflict on the unique index, rerun, and replay it. Stock moves once.
func TestShard_KeyRacesAcrossShards(t *testing.T) {
	db, url := openDB(t)
	const sku = "keyrace"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 4}, 4000)
	a, b := newServer(t, db, "a"), newServer(t, db, "b")
	acquire(t, a, sku, 1, 0, 2)
	acquire(t, b, sku, 1, 1, 3)
	servers := []*shard.Server{a, b, a, b}
	ctx := context.Background()

	// Hold the four partition rows so that every writer's first batch
	// waits at its fence while the rest queue up; then let them all go at
	// once, with the same keys in every shard's next batch.
	released := holdFences(t, url, sku, 500*time.Millisecond, 0, 1, 2, 3)

	const keys = 100
	results := make([][4]stock.Result, keys)
	parallel(t, keys*4, 60*time.Second, func(i int) {
		k, idx := i/4, int32(i%4)
		results[k][idx] = servers[idx].Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: 3, Key: key("race", k)})
	})
	<-released
	for k, rs := range results {
		firsts := 0
		for idx, r := range rs {
			if r.Err != nil {
				t.Errorf("key %d on shard %d = %v", k, idx, r.Err)
				continue
			}
			if !r.Replayed {
				firsts++
			}
			if r.Operation.Shard != rs[0].Operation.Shard && rs[0].Err == nil {
				t.Errorf("key %d: shard %d answers for shard %d, shard 0 for %d", k, idx, r.Operation.Shard, rs[0].Operation.Shard)
			}
		}
		if firsts != 1 {
			t.Errorf("key %d: %d first successes, want exactly 1", k, firsts)
		}
	}
	if c := total(t, db, sku); c.Sold != 3*keys {
		t.Errorf("sold = %d, want %d", c.Sold, 3*keys)
	}
	reconcile(t, db, sku)
}

// TestShard_CommitRacesRelease: a commit and a release of the same
// reservation at once (on top of the sweeper): one wins, the other reports
// it, stock moves once.
func TestShard_CommitRacesRelease(t *testing.T) {
	db, _ := openDB(t)
	const sku = "endrace"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1}, 1000)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0)
	ctx := context.Background()
	sh := stock.ShardKey{SKU: sku}
	const n = 60
	ids := make([]string, n)
	for i := range ids {
		res := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: sh, Quantity: 2, Key: key("cr", i)})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		ids[i] = res.Reservation.ID
	}
	got := make([]stock.Result, 2*n)
	parallel(t, 2*n, 30*time.Second, func(i int) {
		kind := stock.OpCommit
		if i%2 == 1 {
			kind = stock.OpRelease
		}
		got[i] = s.Do(ctx, &stock.Request{Kind: kind, Shard: sh, ReservationID: ids[i/2]})
	})
	var committed, released int64
	for i := 0; i < n; i++ {
		c, r := got[2*i], got[2*i+1]
		switch {
		case c.Err == nil && r.Err != nil && r.Err.Code == stock.CodeReservationAlreadyCommitted:
			committed++
		case r.Err == nil && c.Err != nil && c.Err.Code == stock.CodeReservationAlreadyReleased:
			released++
		default:
			t.Errorf("reservation %d: commit %+v, release %+v: want exactly one to win", i, c, r)
		}
	}
	if c := total(t, db, sku); c.Sold != 2*committed || c.Reserved != 0 || c.Available != 1000-2*committed {
		t.Errorf("total = %+v after %d commits and %d releases", c, committed, released)
	}
	reconcile(t, db, sku)
}

// TestShard_GroupTakesFollowers: a writer whose group has just committed
// and that has requests queued joins the next group, beside the batch that
// queued while its group ran, instead of the two writers taking turns in
// groups of one.
func TestShard_GroupTakesFollowers(t *testing.T) {
	db, url := openDB(t)
	const sku, perShard = "followers", 20
	createSKU(t, db, stock.SKU{Name: sku, Shards: 2}, 10_000)
	reg := prometheus.NewRegistry()
	s := newServerWith(t, shard.Config{ServerID: "a", DB: db, Logger: testLogger(), Registerer: reg})
	acquire(t, s, sku, 1, 0, 1)
	ctx := context.Background()

	// Shard 0's first batch waits at its fence, in a group of its own,
	// while shard 0's next requests queue behind it and shard 1's first
	// batch queues for the next group.
	released := holdFences(t, url, sku, 500*time.Millisecond, 0)
	deduct := func(idx int32, k string) {
		if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: 1, Key: k}); r.Err != nil {
			t.Errorf("deduct %s on shard %d = %v", k, idx, r.Err)
		}
	}
	first := make(chan struct{})
	go func() { defer close(first); deduct(0, "first") }()
	time.Sleep(200 * time.Millisecond) // the first batch is at the fence
	parallel(t, 2*perShard, 30*time.Second, func(i int) { deduct(int32(i%2), key("follow", i)) })
	<-first
	<-released

	var single uint64
	h := metricFamily(t, reg, "shardstock_shard_group_batches").GetMetric()[0].GetHistogram()
	count := h.GetSampleCount()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 1 {
			single = b.GetCumulativeCount()
		}
	}
	if count == 0 {
		t.Fatal("no group observed")
	}
	if count == single {
		t.Errorf("all %d groups carried one shard's batch: the writers took turns instead of sharing groups", count)
	}
	t.Logf("%d groups, %d of one batch", count, single)
	reconcile(t, db, sku)
}

// holdFences locks the partition rows of sku's shards idx, in a
// transaction of its own, so that every batch of those shards waits at its
// fence until d has passed; the channel is closed once they are released.
func holdFences(tb testing.TB, url, sku string, d time.Duration, idx ...int32) <-chan struct{} {
	tb.Helper()
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	tx, err := lock.Begin(ctx)
	if err != nil {
		lock.Close(ctx)
		tb.Fatal(err)
	}
	for _, i := range idx {
		if _, err := tx.Exec(ctx, "SELECT 1 FROM partitions WHERE partition = $1 FOR UPDATE", stock.PartitionOf(sku, i)); err != nil {
			lock.Close(ctx)
			tb.Fatal(err)
		}
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(d)
		tx.Rollback(ctx)
		lock.Close(ctx)
	}()
	return released
}

// TestShard_SpeculatesWarmBatches: a writer that has its row and its SKU
// sends its deducts in one round trip (postgres.DB's speculative groups);
// a retry of a recorded key falls back to the read and is answered as the
// replay it is, deducting nothing.
func TestShard_SpeculatesWarmBatches(t *testing.T) {
	const sku = "speculate"
	db, _, s, reg := meteredServer(t, sku, 1, 100)
	ctx := context.Background()
	deduct := func(k string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: k})
	}
	for i := range 5 {
		if r := deduct(key("k", i)); r.Err != nil || r.Replayed {
			t.Fatalf("deduct %s = %+v, want a new success", key("k", i), r)
		}
	}
	if r := deduct(key("k", 2)); r.Err != nil || !r.Replayed || r.Operation == nil || r.Operation.Quantity != 1 {
		t.Errorf("retry of %s = %+v, want a replay of its first answer", key("k", 2), r)
	}
	committed := speculativeGroups(t, reg, "committed")
	if fellBack := speculativeGroups(t, reg, "fell_back"); committed < 4 || fellBack != 1 {
		t.Errorf("speculative groups: %v committed, %v fell back; want the 4 warm deducts in one round trip each, and the retry fallen back", committed, fellBack)
	}
	reconcile(t, db, sku)
}

// TestShard_SeedsSiblings: the first batch of a SKU on a server reads every
// shard of it; the writers of the others then start from those rows, and
// their first batches are speculative (one round trip, no read). A seed
// that turned stale writes nothing on its own: the group reads the row and
// decides from it, with no divergence and no halt. A seed of an earlier
// ownership is not used.
func TestShard_SeedsSiblings(t *testing.T) {
	const sku = "seeds"
	db, url, s, reg := meteredServer(t, sku, 4, 100)
	ctx := context.Background()
	deduct := func(idx int32, k string) {
		t.Helper()
		if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: 1, Key: k}); r.Err != nil || r.Replayed {
			t.Fatalf("deduct %s on shard %d = %+v, want a new success", k, idx, r)
		}
	}
	deduct(0, "k0") // cold: reads the SKU's four rows first, then speculates
	if c, f := speculativeGroups(t, reg, "committed"), speculativeGroups(t, reg, "fell_back"); c != 1 || f != 0 {
		t.Fatalf("speculative groups after the cold batch: %v committed, %v fell back; want 1 and 0", c, f)
	}
	deduct(1, "k1")
	deduct(2, "k2")
	if c, f := speculativeGroups(t, reg, "committed"), speculativeGroups(t, reg, "fell_back"); c != 3 || f != 0 {
		t.Errorf("speculative groups: %v committed, %v fell back; want the seeded shards' first batches too, 3, in one round trip each", c, f)
	}
	// Shard 3's row changes behind the server's back after its seed was
	// taken: the speculative write compares it and writes nothing, and the
	// group reads the row.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE shards SET available = available + 5 WHERE sku = $1 AND idx = 3`, sku); err != nil {
		t.Fatal(err)
	}
	deduct(3, "k3")
	if f := speculativeGroups(t, reg, "fell_back"); f != 1 {
		t.Errorf("speculative groups fallen back = %v, want 1 (the stale seed)", f)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "shardstock_shard_divergences_total" {
			t.Errorf("divergences after a stale seed: %v, want none (the row is read, not rechecked)", mf.GetMetric())
		}
	}
	if got, want := total(t, db, sku), (stock.Counts{Available: 100 + 5 - 4, Sold: 4}); got != want {
		t.Errorf("total = %+v, want %+v", got, want)
	}
	// A seed read under an earlier ownership is not used: after the
	// partitions are taken over again, a first batch reads its row.
	const sku2 = "seeds-2"
	createSKU(t, db, stock.SKU{Name: sku2, Shards: 2}, 10)
	acquire(t, s, sku2, 1, 0, 1)
	deduct2 := func(idx int32, k string) {
		t.Helper()
		if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku2, Index: idx}, Quantity: 1, Key: k}); r.Err != nil || r.Replayed {
			t.Fatalf("deduct %s on shard %d = %+v, want a new success", k, idx, r)
		}
	}
	deduct2(0, "m0") // seeds shard 1 at epoch 1
	acquire(t, s, sku2, 2, 0, 1)
	// Halted behind the server's back: the epoch 1 seed does not show it.
	// Sent from that seed, shard 1's first batch would be a speculative
	// write that falls back; read first, it is not sent.
	if _, err := conn.Exec(ctx, `UPDATE shards SET halted_reason = 'test: halted' WHERE sku = $1 AND idx = 1`, sku2); err != nil {
		t.Fatal(err)
	}
	before := speculativeGroups(t, reg, "fell_back")
	if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku2, Index: 1}, Quantity: 1, Key: "m1"}); r.Err == nil || r.Err.Code != stock.CodeShardUnavailable {
		t.Errorf("deduct m1 on a halted shard = %+v, want SHARD_UNAVAILABLE", r)
	}
	if f := speculativeGroups(t, reg, "fell_back"); f != before {
		t.Errorf("shard 1's first batch after a takeover was sent from a seed of the earlier ownership (%v groups fell back, %v before)", f, before)
	}
	if _, err := conn.Exec(ctx, `UPDATE shards SET halted_reason = '' WHERE sku = $1 AND idx = 1`, sku2); err != nil {
		t.Fatal(err)
	}
	reconcile(t, db, sku2)

	// Nothing is refused from a seed without a transaction: shard 1 of
	// sku3 holds 5 units by its seed and 10 by its row.
	const sku3 = "seeds-3"
	createSKU(t, db, stock.SKU{Name: sku3, Shards: 2}, 10)
	acquire(t, s, sku3, 1, 0, 1)
	if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku3, Index: 0}, Quantity: 1, Key: "n0"}); r.Err != nil {
		t.Fatalf("deduct n0 = %+v", r)
	}
	if _, err := conn.Exec(ctx, `UPDATE shards SET available = available + 5 WHERE sku = $1 AND idx = 1`, sku3); err != nil {
		t.Fatal(err)
	}
	if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku3, Index: 1}, Quantity: 8, Key: "n1"}); r.Err != nil {
		t.Errorf("deduct of 8 from a shard of 10 whose seed says 5 = %+v, want a success", r)
	}
}

// TestShard_SpeculatesCommits: commits and releases of reservations their
// writer made are decided before any read (one round trip); a retry, the
// writer having forgotten the reservation it ended, reads and is answered
// as a replay; a reservation ended behind the writer's back writes nothing
// speculatively and is answered from what is read.
func TestShard_SpeculatesCommits(t *testing.T) {
	const sku = "spec-commit"
	db, url, s, reg := meteredServer(t, sku, 1, 100)
	ctx := context.Background()
	k := stock.ShardKey{SKU: sku}
	reserve := func(key string) *stock.Reservation {
		t.Helper()
		r := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: k, Quantity: 2, Key: key, Source: stock.SourceAPI})
		if r.Err != nil || r.Reservation == nil {
			t.Fatalf("reserve %s = %+v", key, r)
		}
		return r.Reservation
	}
	end := func(kind stock.OpKind, id string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: kind, Shard: k, ReservationID: id, Source: stock.SourceAPI})
	}
	r0, r1 := reserve("r0"), reserve("r1")
	before := speculativeGroups(t, reg, "committed")
	if r := end(stock.OpCommit, r0.ID); r.Err != nil || r.Replayed || r.Reservation.State != stock.ReservationCommitted {
		t.Errorf("commit of r0 = %+v, want it committed", r)
	}
	// A retry, while r1 is still held (so that a commit decided again
	// from the writer's memory would be a valid write): the writer
	// forgot r0, reads it, and answers a replay.
	if r := end(stock.OpCommit, r0.ID); r.Err != nil || !r.Replayed || r.Reservation.State != stock.ReservationCommitted {
		t.Errorf("retry of r0's commit = %+v, want a replay", r)
	}
	if f := speculativeGroups(t, reg, "fell_back"); f != 0 {
		t.Errorf("speculative groups fallen back = %v, want 0 (the writer forgets what it ended)", f)
	}
	if r := end(stock.OpRelease, r1.ID); r.Err != nil || r.Replayed || r.Reservation.State != stock.ReservationReleased {
		t.Errorf("release of r1 = %+v, want it released", r)
	}
	if c := speculativeGroups(t, reg, "committed"); c != before+2 {
		t.Errorf("speculative groups: %v committed, want %v (the commit and the release in one round trip each)", c, before+2)
	}
	if got, want := total(t, db, sku), (stock.Counts{Available: 98, Sold: 2}); got != want {
		t.Errorf("total = %+v, want %+v", got, want)
	}
	reconcile(t, db, sku)

	// r2 ends behind the writer's back (as only another writer of the
	// shard could): the commit decided from the writer's memory writes
	// nothing, and the one decided from the read refuses it.
	r2 := reserve("r2")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE reservations SET state = 'expired', ended_at = now() WHERE id = $1`, r2.ID); err != nil {
		t.Fatal(err)
	}
	fellBack := speculativeGroups(t, reg, "fell_back")
	if r := end(stock.OpCommit, r2.ID); r.Err == nil || r.Err.Code != stock.CodeReservationExpired {
		t.Errorf("commit of r2, expired behind the writer's back = %+v, want RESERVATION_EXPIRED", r)
	}
	if f := speculativeGroups(t, reg, "fell_back"); f != fellBack+1 {
		t.Errorf("speculative groups fallen back = %v, want %v", f, fellBack+1)
	}
	var commits int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE reservation_id = $1 AND kind = 'commit'`, r2.ID).Scan(&commits); err != nil || commits != 0 {
		t.Errorf("commit entries of r2 = %d (%v), want 0", commits, err)
	}
}

// meteredServer starts server "a" with a metrics registry of its own on a
// new database, owning every shard of a new SKU at epoch 1.
func meteredServer(tb testing.TB, sku string, shards int32, initial int64) (*postgres.DB, string, *shard.Server, *prometheus.Registry) {
	tb.Helper()
	db, url := openDB(tb)
	createSKU(tb, db, stock.SKU{Name: sku, Shards: shards}, initial)
	reg := prometheus.NewRegistry()
	s := newServerWith(tb, shard.Config{ServerID: "a", DB: db, Logger: testLogger(), Registerer: reg})
	for i := range shards {
		acquire(tb, s, sku, 1, i)
	}
	return db, url, s, reg
}

func speculativeGroups(tb testing.TB, reg *prometheus.Registry, outcome string) float64 {
	tb.Helper()
	m := series(reg, "shardstock_shard_speculative_groups_total", map[string]string{"outcome": outcome})
	if m == nil {
		tb.Fatalf("no shardstock_shard_speculative_groups_total{outcome=%q}", outcome)
	}
	return m.GetCounter().GetValue()
}

// counterValue is the counter name{label=value} of reg, 0 if it is not
// there (yet); for goroutines other than the test's, which must not stop
// the test.
func counterValue(reg *prometheus.Registry, name, label, value string) float64 {
	return series(reg, name, map[string]string{label: value}).GetCounter().GetValue()
}

// series is the series of family name in reg with every label of labels,
// nil if there is none (yet, or reg cannot be gathered). It fails no test,
// so goroutines other than the test's may call it.
func series(reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

// metricFamily gathers reg and returns the family called name.
func metricFamily(tb testing.TB, reg *prometheus.Registry, name string) *dto.MetricFamily {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	tb.Fatalf("no metric %s", name)
	return nil
}

// TestShard_GroupDelay: with a group delay, deducts to several shards that
// arrive a few milliseconds apart share one group, where without it each
// would go alone, and each is answered after about the delay, not before.
func TestShard_GroupDelay(t *testing.T) {
	db, _ := openDB(t)
	const sku, shards, delay = "lingers", 4, 300 * time.Millisecond
	createSKU(t, db, stock.SKU{Name: sku, Shards: shards}, 10_000)
	reg := prometheus.NewRegistry()
	s := newServerWith(t, shard.Config{ServerID: "a", DB: db, Logger: testLogger(), Registerer: reg},
		func(s *shard.Server) { shard.SetGroupDelay(s, delay) })
	acquire(t, s, sku, 1, 0, 1, 2, 3)
	ctx := context.Background()
	// Warm every writer (its row read), then count the groups of the
	// spaced deducts alone.
	parallel(t, shards, 30*time.Second, func(i int) {
		if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: int32(i)}, Quantity: 1, Key: key("warm", i)}); r.Err != nil {
			t.Errorf("warm-up deduct on shard %d = %v", i, r.Err)
		}
	})
	groups := func() uint64 {
		return metricFamily(t, reg, "shardstock_shard_group_batches").GetMetric()[0].GetHistogram().GetSampleCount()
	}
	before := groups()
	start := time.Now()
	parallel(t, shards, 30*time.Second, func(i int) {
		time.Sleep(time.Duration(i) * 20 * time.Millisecond) // well apart, well within the delay
		if r := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: int32(i)}, Quantity: 1, Key: key("spaced", i)}); r.Err != nil {
			t.Errorf("deduct on shard %d = %v", i, r.Err)
		}
	})
	if took, n := time.Since(start), groups()-before; n != 1 || took < delay {
		t.Errorf("%d deducts 20ms apart: %d groups in %v, want 1 group after at least the delay %v", shards, n, took, delay)
	}
	reconcile(t, db, sku)
}
