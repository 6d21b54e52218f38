package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// consumer is a change stream's consumer that keeps its cursor and what it
// received, session by session (a session ends when the consumer is killed
// or the stream ends).
type consumer struct {
	stream   *ledger.Stream
	cursor   ledger.Cursor
	mu       sync.Mutex
	sessions [][]stock.LedgerEntry
}

// session watches from the consumer's cursor until stop says so (then it
// is killed: it receives nothing more) or the stream ends, and returns how
// it ended.
func (c *consumer) session(t *testing.T, stop func(received int) bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.mu.Lock()
	c.sessions = append(c.sessions, nil)
	n := len(c.sessions) - 1
	c.mu.Unlock()
	return c.stream.WatchLedger(ctx, ledger.Watch{Cursor: c.cursor, Consumer: "faults"}, func(d ledger.Delivery) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if d.Entry != nil {
			c.sessions[n] = append(c.sessions[n], *d.Entry)
		}
		// The consumer handles the entry, then keeps the cursor after it.
		c.cursor = mustCursor(t, d.Cursor)
		if stop(len(c.sessions[n])) {
			return errKilled // it receives nothing more
		}
		return nil
	})
}

// errKilled ends a consumer's session.
var errKilled = errors.New("consumer killed")

// TestStream_UnderFaults: shard writers sell and replenish a SKU of four
// shards throughout; a consumer is killed and resumes from its cursor
// twice, the shard server is replaced by another (a takeover at a newer
// epoch), and Postgres is crash-restarted under the consumer (its stream
// ends, it resumes). At the end the entries it received are the ledger, none
// missing, none twice within a session; per shard, in the order of their
// before/after chain.
func TestStream_UnderFaults(t *testing.T) {
	ctx := context.Background()
	cluster, err := pgcluster.Start(ctx, "") // its own: it is crashed
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Stop() })
	db, err := postgres.Open(ctx, cluster.URL(), postgres.Options{ApplicationName: "ledgerfaults"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	const sku, shards = "faulty", 4
	if err := db.CreateSKU(ctx, stock.SKU{Name: sku, Shards: shards, Status: stock.StatusActive, ReservationTTL: stock.ReservationTTLDefault}, 1_000_000); err != nil {
		t.Fatal(err)
	}
	// serve starts a shard server owning the SKU's partitions at epoch and
	// returns it and what stops it.
	serve := func(id string, epoch int64) (*shard.Server, func()) {
		srv := shard.New(shard.Config{ServerID: id, DB: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		sctx, cancel := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() { srv.Run(sctx); close(served) }()
		for i := range int32(shards) {
			if err := srv.Acquire(ctx, stock.ShardKey{SKU: sku, Index: i}.Partition(), epoch); err != nil {
				t.Fatal(err)
			}
		}
		return srv, func() { cancel(); <-served }
	}
	first, stopFirst := serve("srv-1", 1)
	var current atomic.Pointer[shard.Server]
	current.Store(first)

	// Writers: one per shard, a deduct or (every fifth) a replenish at a
	// time, errors (the crash) and all.
	var written atomic.Int64
	wctx, stopWriters := context.WithCancel(ctx)
	var writers sync.WaitGroup
	for i := range int32(shards) {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for n := 0; wctx.Err() == nil; n++ {
				r := &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: i}, Quantity: 1, Key: fmt.Sprintf("w%d-%d", i, n)}
				if n%5 == 4 {
					r.Kind, r.Quantity = stock.OpReplenish, 2
				}
				rctx, cancel := context.WithTimeout(wctx, 5*time.Second)
				if current.Load().Do(rctx, r).Err == nil {
					written.Add(1)
				}
				cancel()
			}
		}()
	}
	defer func() { stopWriters(); writers.Wait() }()

	c := &consumer{stream: ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": db}, PollInterval: streamPoll})}
	// Killed twice, each after 40 entries.
	for range 2 {
		if err := c.session(t, func(n int) bool { return n >= 40 }); !errors.Is(err, errKilled) {
			t.Fatalf("session ended with %v, want killed", err)
		}
	}
	// The shard server stops mid-write; another takes its partitions over
	// at a newer epoch (fenced) and the writers go on through it.
	stopFirst()
	second, stopSecond := serve("srv-2", 2)
	defer stopSecond()
	current.Store(second)
	// Postgres crashes under the third session, after 20 entries.
	crashed := make(chan error, 1)
	err = c.session(t, func(n int) bool {
		if n == 20 {
			go func() { crashed <- cluster.Crash() }()
		}
		return false
	})
	if err := <-crashed; err != nil {
		t.Fatal(err)
	}
	if stock.CodeOf(err) != stock.CodeShardUnavailable {
		t.Fatalf("the session under the crash ended with %v, want SHARD_UNAVAILABLE", err)
	}
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// Writes go on after the restart; then the writers stop, and the
	// consumer resumes until it has the whole ledger.
	before := written.Load()
	for deadline := time.Now().Add(20 * time.Second); written.Load() < before+40; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no writes within 20 s of the restart (%d before it)", before)
		}
	}
	stopWriters()
	writers.Wait()
	conn, err := pgx.Connect(ctx, cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT id FROM ledger`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	var bySecond int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE server_id = 'srv-2'`).Scan(&bySecond); err != nil || bySecond == 0 {
		t.Fatalf("entries written by the second shard server: %d (%v), want some", bySecond, err)
	}
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	// received is every entry received; the caller holds c.mu (stop is
	// called with it held).
	received := func() map[int64]bool {
		got := map[int64]bool{}
		for _, s := range c.sessions {
			for _, e := range s {
				got[e.ID] = true
			}
		}
		return got
	}
	if err := c.session(t, func(int) bool { return len(received()) >= len(want) }); !errors.Is(err, errKilled) {
		t.Fatalf("the last session ended with %v (received %d of %d entries)", err, len(received()), len(want))
	}

	c.mu.Lock() // the sessions have ended: for the race detector's sake
	defer c.mu.Unlock()
	got := received()
	for id := range want {
		if !got[id] {
			t.Errorf("entry %d is in the ledger and was never received", id)
		}
	}
	for id := range got {
		if !want[id] {
			t.Errorf("entry %d was received and is not in the ledger", id)
		}
	}
	chains := map[int32]stock.Counts{}
	seen := map[int64]bool{}
	for i, s := range c.sessions {
		inSession := map[int64]bool{}
		for _, e := range s {
			if inSession[e.ID] {
				t.Errorf("session %d received entry %d twice", i, e.ID)
			}
			inSession[e.ID] = true
			if seen[e.ID] {
				continue // again after a resume: at least once
			}
			seen[e.ID] = true
			if last, ok := chains[e.Shard.Index]; ok && last != e.Before {
				t.Errorf("shard %d: entry %d starts at %+v, the one before it ended at %+v", e.Shard.Index, e.ID, e.Before, last)
			}
			chains[e.Shard.Index] = e.After
		}
	}
	t.Logf("%d entries, %d received in %d sessions (%d written before the crash's restart)", len(want), func() (n int) {
		for _, s := range c.sessions {
			n += len(s)
		}
		return n
	}(), len(c.sessions), before)
}
