package shard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/faultproxy"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of the crash tests.
const (
	// durableClients sends one-unit deducts with unique keys, each retried
	// with its key until a definite answer.
	durableClients = 24
	// durableRetryFor bounds the retries of one key: longer than a restart
	// of the database plus a writer's wait for a lost commit's outcome.
	durableRetryFor = 60 * time.Second
	// durableCallTimeout is one attempt's deadline.
	durableCallTimeout = 5 * time.Second
)

// durableStack is several shard servers, each with its own pool, writing
// the shards of a few SKUs to one database.
type durableStack struct {
	db      *postgres.DB   // for the checks
	dbs     []*postgres.DB // the servers' own
	servers []*shard.Server
	owner   map[stock.ShardKey]*shard.Server
	skus    []string
	shards  int32
}

// newDurableStack starts servers shard servers on serverURL and creates skus
// SKUs of shards shards each through checkURL (the same database, perhaps
// by another path).
func newDurableStack(t *testing.T, checkURL, serverURL string, servers, skus int, shards int32) *durableStack {
	t.Helper()
	open := func(name, url string) *postgres.DB {
		db, err := postgres.Open(context.Background(), url, postgres.Options{MaxConns: 8, ApplicationName: name})
		if err != nil {
			t.Fatalf("postgres.Open: %v", err)
		}
		t.Cleanup(db.Close)
		return db
	}
	st := &durableStack{db: open("durability-check", checkURL), owner: map[stock.ShardKey]*shard.Server{}, shards: shards}
	for i := range servers {
		id := fmt.Sprintf("s%d", i)
		db := open(id, serverURL)
		st.dbs = append(st.dbs, db)
		st.servers = append(st.servers, newServer(t, db, id))
	}
	acquired := map[int32]bool{}
	for i := range skus {
		sku := fmt.Sprintf("durable-%d", i)
		st.skus = append(st.skus, sku)
		createSKU(t, st.db, stock.SKU{Name: sku, Shards: shards}, 1_000_000*int64(shards))
		for idx := range shards {
			p := stock.PartitionOf(sku, idx)
			s := st.servers[int(p)%servers]
			st.owner[stock.ShardKey{SKU: sku, Index: idx}] = s
			if !acquired[p] {
				acquired[p] = true
				acquire(t, s, sku, 1, idx)
			}
		}
	}
	return st
}

// ack is what a client was told of one key.
type ack struct {
	shard stock.ShardKey
	op    *stock.Operation
}

// load runs durableClients until stop closes, each sending deducts with
// unique keys and retrying every retryable answer with the same key until a
// definite one. It returns the acknowledged keys and how many retryable
// answers came back.
func (st *durableStack) load(t *testing.T, stop <-chan struct{}) (map[string]ack, int64) {
	t.Helper()
	var mu sync.Mutex
	acked := map[string]ack{}
	var retries atomic.Int64
	parallel(t, durableClients, 5*time.Minute, func(c int) {
		rng := rand.New(rand.NewPCG(uint64(c), 7))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := key(fmt.Sprintf("c%02d", c), i)
			sh := stock.ShardKey{SKU: st.skus[rng.IntN(len(st.skus))], Index: rng.Int32N(st.shards)}
			deadline := time.Now().Add(durableRetryFor)
			for {
				ctx, cancel := context.WithTimeout(context.Background(), durableCallTimeout)
				res := st.owner[sh].Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: k})
				cancel()
				if res.Err == nil {
					mu.Lock()
					acked[k] = ack{shard: sh, op: res.Operation}
					mu.Unlock()
					break
				}
				if !res.Err.Code.Retryable() || time.Now().After(deadline) {
					t.Errorf("Deduct(%s on %s) = %v, want a success within %v", k, sh, res.Err, durableRetryFor)
					return
				}
				retries.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	return acked, retries.Load()
}

// lostCommits sums the servers' lost commits by outcome.
func (st *durableStack) lostCommits() stock.LostCommits {
	var sum stock.LostCommits
	for _, db := range st.dbs {
		l := db.LostCommits()
		sum.Committed += l.Committed
		sum.Voided += l.Voided
		sum.Unknown += l.Unknown
	}
	return sum
}

// check verifies the books after the load: every acknowledged deduct is in
// the ledger and the operations exactly once and nothing else is; every
// shard's row is what its writer holds and what its ledger sums to; no
// shard is halted (each takes a new deduct); a retried key replays.
func (st *durableStack) check(t *testing.T, acked map[string]ack) {
	t.Helper()
	ctx := context.Background()
	inLedger := map[string]int{}
	for _, sku := range st.skus {
		for _, e := range ledgerEntries(t, st.db, sku) {
			if e.Kind == stock.OpDeduct {
				inLedger[e.IdempotencyKey]++
			}
		}
		reconcile(t, st.db, sku)
	}
	lost, doubled := 0, 0
	for k := range acked {
		switch n := inLedger[k]; {
		case n == 0:
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged deduct %s (on %s) is not in the ledger", k, acked[k].shard)
			}
		case n > 1:
			doubled++
			t.Errorf("acknowledged deduct %s is in the ledger %d times", k, n)
		}
	}
	for k := range inLedger {
		if _, ok := acked[k]; !ok {
			t.Errorf("ledger holds deduct %s that no client was told of", k)
		}
	}
	keys := map[string][]string{} // by SKU: operations are keyed by (sku, key)
	for k, a := range acked {
		keys[a.shard.SKU] = append(keys[a.shard.SKU], k)
	}
	found := 0
	for sku, ks := range keys {
		ops, err := st.db.LookupOperations(ctx, sku, ks)
		if err != nil {
			t.Fatalf("LookupOperations(%s) = %v", sku, err)
		}
		found += len(ops)
	}
	if found != len(acked) {
		t.Errorf("operations hold %d of the %d acknowledged keys", found, len(acked))
	}
	if lost > 0 || doubled > 0 {
		t.Errorf("%d acknowledged deducts lost, %d doubled, of %d", lost, doubled, len(acked))
	}
	for sh, s := range st.owner {
		res := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "after-" + sh.String()})
		if res.Err != nil {
			t.Errorf("Deduct on %s after the crashes = %v, want a success (no shard halted)", sh, res.Err)
			continue
		}
		mem, err := s.Counts(ctx, sh)
		if err != nil {
			t.Fatalf("Counts(%s) = %v", sh, err)
		}
		row, err := st.db.LoadShard(ctx, sh)
		if err != nil {
			t.Fatalf("LoadShard(%s) = %v", sh, err)
		}
		if mem != row {
			t.Errorf("shard %s: writer holds %+v, row is %+v", sh, mem, row)
		}
	}
	replays := 0
	for k, a := range acked {
		if replays == 20 {
			break
		}
		replays++
		res := st.owner[a.shard].Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: a.shard, Quantity: 1, Key: k})
		if res.Err != nil || !res.Replayed {
			t.Errorf("Deduct(%s) again = %+v, want its first result replayed", k, res)
		}
	}
}

// TestShard_PostgresCrash crash-restarts a private Postgres (SIGQUIT to the
// postmaster: pg_ctl stop -m immediate) while three shard servers commit
// batches, then checks that every deduct a client was told of is in the
// books exactly once. After a crash Postgres hands out again the
// transaction ids that never reached its WAL, so a writer that learnt a lost
// commit's outcome from its transaction id answered sales that were never
// written (this test failed on that code).
func TestShard_PostgresCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crashes a Postgres of its own")
	}
	const crashes = 6
	cluster, err := pgcluster.Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Stop() })
	st := newDurableStack(t, cluster.URL(), cluster.URL(), 3, 4, 8)

	stop := make(chan struct{})
	var acked map[string]ack
	var retries int64
	loaded := make(chan struct{})
	go func() { acked, retries = st.load(t, stop); close(loaded) }()
	for i := range crashes {
		time.Sleep(700 * time.Millisecond) // batches commit meanwhile
		start := time.Now()
		if err := cluster.Crash(); err != nil {
			t.Fatal(err)
		}
		if err := cluster.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Logf("crash %d: Postgres answered again after %v", i+1, time.Since(start).Round(time.Millisecond))
	}
	time.Sleep(700 * time.Millisecond)
	close(stop)
	<-loaded
	lost := st.lostCommits()
	t.Logf("%d crashes, %d deducts acknowledged, %d retryable answers retried; lost commits: %+v", crashes, len(acked), retries, lost)
	if lost.Committed+lost.Voided == 0 {
		t.Fatal("no commit's answer was lost: the crashes did not land on a commit")
	}
	st.check(t, acked)
}

// TestShard_CommitAnswerLost cuts shard servers' connections to Postgres
// in a fault-injecting proxy, half the time after forwarding a COMMIT
// (the batch commits, its answer is lost) and half the time instead of
// forwarding it (the batch never commits), and checks that every deduct a
// client was told of is in the books exactly once.
func TestShard_CommitAnswerLost(t *testing.T) {
	const cutsEach = 8
	url := pgtest.NewMigratedDB(t)
	proxy, proxied, err := faultproxy.StartPostgres(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	st := newDurableStack(t, url, proxied, 2, 2, 4)

	stop := make(chan struct{})
	var acked map[string]ack
	loaded := make(chan struct{})
	go func() { acked, _ = st.load(t, stop); close(loaded) }()
	for i := range 2 * cutsEach {
		cut := faultproxy.CutReply
		if i%2 == 1 {
			cut = faultproxy.CutRequest
		}
		proxy.Arm(faultproxy.Commit, cut)
		deadline := time.Now().Add(10 * time.Second)
		for proxy.Armed() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	<-loaded
	lost := st.lostCommits()
	t.Logf("%d cuts, %d deducts acknowledged; lost commits: %+v", proxy.Cuts(), len(acked), lost)
	if proxy.Cuts() != 2*cutsEach {
		t.Errorf("%d cuts fired, want %d", proxy.Cuts(), 2*cutsEach)
	}
	if lost.Committed == 0 || lost.Voided == 0 {
		t.Errorf("lost commits %+v: want both a committed one (answer cut) and a voided one (COMMIT cut)", lost)
	}
	st.check(t, acked)
}
