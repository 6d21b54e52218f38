package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
)

// streamPoll is the tests' poll interval: short, so that they wait little.
const streamPoll = 20 * time.Millisecond

// insertEntry appends one replenish of a unit keyed key to sku's shard 0
// on q (a connection or a transaction), and returns its id.
func insertEntry(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sku, key string) int64 {
	t.Helper()
	var id int64
	err := q.QueryRow(context.Background(), `INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after,
		reserved_before, reserved_after, sold_before, sold_after, idempotency_key, source, server_id, epoch)
		VALUES ($1, 0, 'replenish', 1, 0, 1, 0, 0, 0, 0, $2, 'test', 'test', 1) RETURNING id`, sku, key).Scan(&id)
	if err != nil {
		t.Fatalf("insert entry %s: %v", key, err)
	}
	return id
}

// watched is what one watch received.
type watched struct {
	keys   []string // the entries' keys, in order
	dbs    []string // the database of each
	cursor string   // the last cursor received ("" if none)
	err    error    // what WatchLedger returned
}

// watchFor runs WatchLedger from w until done says it has enough (then
// for linger more, to catch what it should not receive) or within, and
// returns what it received.
func watchFor(t *testing.T, s *ledger.Stream, w ledger.Watch, within, linger time.Duration, done func(watched) bool) watched {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var mu sync.Mutex
	var got watched
	var once sync.Once
	err := s.WatchLedger(ctx, w, func(d ledger.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if d.Entry != nil {
			got.keys = append(got.keys, d.Entry.IdempotencyKey)
			got.dbs = append(got.dbs, d.Database)
		}
		got.cursor = d.Cursor
		if done(got) {
			once.Do(func() { time.AfterFunc(linger, cancel) })
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	got.err = err
	return got
}

// has says whether a watch has received every key of want.
func has(want ...string) func(watched) bool {
	return func(w watched) bool {
		for _, k := range want {
			if !slices.Contains(w.keys, k) {
				return false
			}
		}
		return true
	}
}

func mustCursor(t *testing.T, s string) ledger.Cursor {
	t.Helper()
	c, err := ledger.ParseCursor(s)
	if err != nil {
		t.Fatalf("ParseCursor(%q) = %v", s, err)
	}
	return c
}

// TestStream: the change stream, its subtests on one database (and a
// second one) of a private cluster, each on SKUs of its own, watching only
// those.
func TestStream(t *testing.T) {
	urls := pgtest.NewPrivateDBs(t, 2)
	b := openBooksAt(t, urls[0], 0)
	t.Run("OutOfOrderCommits", func(t *testing.T) { testOutOfOrderCommits(t, b) })
	t.Run("SKUs", func(t *testing.T) { testSKUs(t, b) })
	t.Run("Refused", func(t *testing.T) { testRefused(t, b) })
	t.Run("TwoDatabases", func(t *testing.T) { testTwoDatabases(t, b, openBooksAt(t, urls[1], 0)) })
	t.Run("SharedRead", func(t *testing.T) { testSharedRead(t, b) })
	t.Run("StuckConsumer", func(t *testing.T) { testStuckConsumer(t, b) })
	t.Run("Lag", func(t *testing.T) { testLag(t, b) })
}

// testOutOfOrderCommits is the change stream's reason to exist: a
// transaction takes a ledger id, another takes the next and commits first,
// and a consumer that stops between the two commits and resumes from its
// cursor still receives both. A reader that followed ids would have sent
// the higher one and resumed after it, skipping the lower for good.
func testOutOfOrderCommits(t *testing.T, b *books) {
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": b.db}, PollInterval: streamPoll})
	insertEntry(t, b.conn, "ooo", "first")

	// A takes the lower id and stays open; B takes the next and commits.
	ctx := context.Background()
	connA, err := pgx.Connect(ctx, b.conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close(ctx)
	txA, err := connA.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	low := insertEntry(t, txA, "ooo", "low")
	high := insertEntry(t, b.conn, "ooo", "high")
	if low >= high {
		t.Fatalf("ids: A took %d, B %d; want A's lower", low, high)
	}

	// The consumer reads while A is open: "first" only, for five polls
	// after it (a reader by ids sends "high" in the first).
	first := watchFor(t, s, ledger.Watch{SKUs: []string{"ooo"}, Consumer: "out-of-order"}, 10*time.Second, 5*streamPoll, has("first"))
	if !slices.Equal(first.keys, []string{"first"}) || !errors.Is(first.err, context.Canceled) {
		t.Fatalf("while A is open: received %v (%v), want [first] and the watch cancelled", first.keys, first.err)
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	second := watchFor(t, s, ledger.Watch{Cursor: mustCursor(t, first.cursor), SKUs: []string{"ooo"}}, 10*time.Second, 5*streamPoll, has("low", "high"))
	if !slices.Equal(second.keys, []string{"low", "high"}) {
		t.Fatalf("resumed after A's commit: received %v, want [low high] (A's entry, then B's, in commit order)", second.keys)
	}
}

// testTwoDatabases: one cursor covers both databases: a consumer
// that resumes from it receives, of each, what it had not, and only that.
func testTwoDatabases(t *testing.T, a, b *books) {
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": a.db, "db2": b.db}, PollInterval: streamPoll})
	two := []string{"two-a", "two-b"}
	insertEntry(t, a.conn, "two-a", "a1")
	insertEntry(t, b.conn, "two-b", "b1")
	insertEntry(t, b.conn, "two-b", "b2")
	got := watchFor(t, s, ledger.Watch{SKUs: two}, 10*time.Second, 5*streamPoll, has("a1", "b1", "b2"))
	if len(got.keys) != 3 {
		t.Fatalf("received %v, want a1, b1, b2 once each", got.keys)
	}
	c := mustCursor(t, got.cursor)
	if len(c) != 2 {
		t.Fatalf("cursor %v, want a position in each database", c)
	}

	insertEntry(t, b.conn, "two-b", "b3")
	insertEntry(t, a.conn, "two-a", "a2")
	got = watchFor(t, s, ledger.Watch{Cursor: c, SKUs: two}, 10*time.Second, 5*streamPoll, has("a2", "b3"))
	slices.Sort(got.keys)
	if !slices.Equal(got.keys, []string{"a2", "b3"}) {
		t.Fatalf("resumed: received %v, want a2 and b3 only", got.keys)
	}
	for i, k := range got.keys {
		if want := map[byte]string{'a': "main", 'b': "db2"}[k[0]]; !slices.Contains(got.dbs, want) {
			t.Fatalf("entry %d (%s) not from %s: %v", i, k, want, got.dbs)
		}
	}
}

// testSKUs: a watch of some SKUs receives only theirs, and its
// cursor moves past the others' entries too (a cursor alone).
func testSKUs(t *testing.T, b *books) {
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": b.db}, PollInterval: streamPoll})
	insertEntry(t, b.conn, "sku-a", "a1")
	insertEntry(t, b.conn, "sku-b", "b1")
	got := watchFor(t, s, ledger.Watch{SKUs: []string{"sku-a"}}, 10*time.Second, 1300*time.Millisecond, has("a1"))
	if !slices.Equal(got.keys, []string{"a1"}) {
		t.Fatalf("received %v, want [a1]", got.keys)
	}
	// The last cursor (a cursor alone, a second on) is past b1: nothing
	// more from it.
	insertEntry(t, b.conn, "sku-a", "a2")
	got = watchFor(t, s, ledger.Watch{Cursor: mustCursor(t, got.cursor), SKUs: []string{"sku-a"}}, 10*time.Second, 5*streamPoll, has("a2"))
	if !slices.Equal(got.keys, []string{"a2"}) {
		t.Fatalf("resumed: received %v, want [a2]", got.keys)
	}
}

// testRefused: bad input is INVALID_ARGUMENT before anything is
// read or sent.
func testRefused(t *testing.T, b *books) {
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": b.db}, PollInterval: streamPoll})
	for _, tt := range []struct {
		name string
		w    ledger.Watch
		code stock.Code
	}{
		{"UnknownDatabase", ledger.Watch{Cursor: ledger.Cursor{"elsewhere": {XID: 1, ID: 1}}}, stock.CodeInvalidArgument},
		{"AheadOfDatabase", ledger.Watch{Cursor: ledger.Cursor{"main": {XID: 1 << 40, ID: 1}}}, stock.CodeInvalidArgument},
		{"BadSKU", ledger.Watch{SKUs: []string{"no spaces"}}, stock.CodeInvalidSKU},
		{"TooManySKUs", ledger.Watch{SKUs: make([]string, ledger.SKUsWatchedMax+1)}, stock.CodeInvalidArgument},
		{"BadConsumer", ledger.Watch{Consumer: strings.Repeat("c", ledger.ConsumerLenMax+1)}, stock.CodeInvalidArgument},
		{"CursorAndFromNow", ledger.Watch{Cursor: ledger.Cursor{"main": {XID: 1, ID: 1}}, FromNow: true}, stock.CodeInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sent := 0
			err := s.WatchLedger(context.Background(), tt.w, func(ledger.Delivery) error { sent++; return nil })
			if stock.CodeOf(err) != tt.code || sent != 0 {
				t.Fatalf("WatchLedger(%+v) = %v after %d messages, want %s and none", tt.w, err, sent, tt.code)
			}
		})
	}
}

func TestParseCursor(t *testing.T) {
	c := ledger.Cursor{"main": {XID: 12345, ID: 7}, "db-2": {XID: 1 << 40, ID: 1<<63 - 1}}
	back, err := ledger.ParseCursor(c.String())
	if err != nil || len(back) != 2 || back["main"] != c["main"] || back["db-2"] != c["db-2"] {
		t.Fatalf("ParseCursor(%s) = %v, %v; want %v", c, back, err, c)
	}
	if empty, err := ledger.ParseCursor(""); err != nil || len(empty) != 0 {
		t.Fatalf(`ParseCursor("") = %v, %v; want an empty cursor`, empty, err)
	}
	valid := strings.TrimPrefix(c.String(), "c1.")
	for _, bad := range []string{
		"x", "c2." + valid, "c1.!!", "c1." + valid[:len(valid)-2],
		"c1." + strings.Repeat("A", ledger.CursorLenMax),
		ledger.Cursor{"Main": {}}.String(),          // not a database name
		"c1." + "BG1haW4BAQRtYWluAQE",               // "main" twice
		"c1." + "BG1haW4BAQRkYi0yAQE",               // out of order
		"c1." + "BG1haW4B____________AQ",            // id past int64
		ledger.Cursor{"main": {}}.String() + "AAAA", // bytes left over
	} {
		if got, err := ledger.ParseCursor(bad); stock.CodeOf(err) != stock.CodeInvalidArgument {
			t.Errorf("ParseCursor(%q) = %v, %v; want INVALID_ARGUMENT", bad, got, err)
		}
	}
}

// countingReader is a database's Reader that counts the reads that reach
// Postgres.
type countingReader struct {
	ledger.Reader
	changes atomic.Int64
}

func (r *countingReader) Changes(ctx context.Context, after ledger.Position, limit int) ([]ledger.Change, error) {
	r.changes.Add(1)
	return r.Reader.Changes(ctx, after, limit)
}

// follower is a watch run in the background, and what it received.
type follower struct {
	mu   sync.Mutex
	keys []string
	err  error
	done chan struct{}
}

// follow starts a watch of sku on s; send, if set, is called before each
// entry is kept (a consumer that blocks in it stops reading).
func follow(ctx context.Context, s *ledger.Stream, sku string, send func()) *follower {
	f := &follower{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		err := s.WatchLedger(ctx, ledger.Watch{SKUs: []string{sku}}, func(d ledger.Delivery) error {
			if send != nil {
				send()
			}
			if d.Entry != nil {
				f.mu.Lock()
				f.keys = append(f.keys, d.Entry.IdempotencyKey)
				f.mu.Unlock()
			}
			return nil
		})
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
	}()
	return f
}

// ended is how the watch ended, nil if it has not.
func (f *follower) ended() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *follower) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys)
}

// writeEvery appends an entry of sku every d until the returned function
// is called, which returns the keys written, in commit order (one
// connection: one after another).
func writeEvery(t *testing.T, b *books, sku string, d time.Duration) (stop func() []string) {
	var keys []string
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			case <-time.After(d):
			}
			key := fmt.Sprintf("%s-%d", sku, i)
			insertEntry(t, b.conn, sku, key)
			keys = append(keys, key)
		}
	}()
	return func() []string { close(quit); <-done; return keys }
}

// Bounds of testSharedRead.
const (
	sharedWatchers = 16
	sharedWindow   = time.Second // reads are counted over this long, with 1 watch and with 16
)

// testSharedRead: a process reads a database once per poll interval for
// all its watches. With entries written throughout, the reads that reach
// Postgres in a second are counted with one watch attached, then with 16
// (the 15 new ones start from the beginning: they catch up on their own,
// then join the shared read): the same within a few, and every watch
// receives every entry, in commit order.
func testSharedRead(t *testing.T, b *books) {
	r := &countingReader{Reader: b.db}
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": r}, PollInterval: streamPoll})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const sku = "shared"
	stopWrites := writeEvery(t, b, sku, 5*time.Millisecond)
	readsIn := func() int64 {
		before := r.changes.Load()
		time.Sleep(sharedWindow)
		return r.changes.Load() - before
	}
	followers := []*follower{follow(ctx, s, sku, nil)}
	time.Sleep(sharedWindow) // it has caught up
	one := readsIn()
	for range sharedWatchers - 1 {
		followers = append(followers, follow(ctx, s, sku, nil))
	}
	time.Sleep(sharedWindow) // the new ones have caught up
	many := readsIn()
	written := stopWrites()
	t.Logf("reads of the ledger in %s: %d with 1 watch, %d with %d (poll interval %s; %d entries written)", sharedWindow, one, many, sharedWatchers, streamPoll, len(written))
	// A read every poll interval, and a few more (a watch's own reads
	// before it joins, a page that was full).
	polls := int64(sharedWindow / streamPoll)
	if max := one + one/4 + 2; many > max || one > 2*polls {
		t.Errorf("%d reads in %s with %d watches, %d with one: want at most %d, and at most %d with one (one read a poll interval, shared by all)",
			many, sharedWindow, sharedWatchers, one, max, 2*polls)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(streamPoll) {
		all := true
		for _, f := range followers {
			all = all && len(f.received()) >= len(written)
		}
		if all || time.Now().After(deadline) {
			break
		}
	}
	for i, f := range followers {
		if got := f.received(); !slices.Equal(got, written) {
			t.Errorf("watch %d received %d entries (then %v), want the %d written, in order (first difference at %d)", i, len(got), f.ended(), len(written), firstDiff(got, written))
		}
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// testStuckConsumer: a consumer that stops reading (its send blocks) is
// dropped by the shared read once subscriberPagesMax pages wait for it,
// CONSUMER_BEHIND, while another watch of the same database receives
// every entry meanwhile: the stuck one holds back neither.
func testStuckConsumer(t *testing.T, b *books) {
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": b.db}, PollInterval: streamPoll})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const sku = "stuck"
	unstick := make(chan struct{})
	var stuck *follower
	stuck = follow(ctx, s, sku, func() {
		if len(stuck.received()) > 0 {
			<-unstick // it stops reading after its first entry
		}
	})
	live := follow(ctx, s, sku, nil)
	// Both have read what there was (nothing of sku) and joined the
	// shared read before the first entry.
	time.Sleep(sharedWindow)
	stopWrites := writeEvery(t, b, sku, 5*time.Millisecond)
	// 64 pages of the shared read at one every poll interval at least,
	// and more: then the stuck one must have been dropped.
	time.Sleep(100 * streamPoll)
	written := stopWrites()
	for deadline := time.Now().Add(10 * time.Second); len(live.received()) < len(written) && time.Now().Before(deadline); {
		time.Sleep(streamPoll)
	}
	if got := live.received(); !slices.Equal(got, written) {
		t.Errorf("the live watch received %d entries, want the %d written, in order (first difference at %d)", len(got), len(written), firstDiff(got, written))
	}
	close(unstick) // its send returns: it learns it was dropped
	select {
	case <-stuck.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck watch did not end within 10 s of its send returning")
	}
	if stock.CodeOf(stuck.err) != stock.CodeConsumerBehind {
		t.Errorf("the stuck watch ended with %v, want CONSUMER_BEHIND", stuck.err)
	}
	// It receives the rest of the page its send held, and no more.
	if n := len(stuck.received()); n*4 > len(written) {
		t.Errorf("the stuck watch received %d of %d entries, want the first page's only", n, len(written))
	}
}

// lagAge is how old testLag's entries are when a consumer reads them.
const lagAge = 300 * time.Millisecond

// testLag: while a consumer holds a page, the lag metrics say how many
// entries of it the consumer has yet to receive and how old the oldest
// is; once it has received them, nothing; once it leaves, its series go.
func testLag(t *testing.T, b *books) {
	reg := prometheus.NewRegistry()
	s := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": b.db}, PollInterval: streamPoll, Registerer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const sku = "lag"
	insertEntry(t, b.conn, sku, "lag-0")
	held, hold := make(chan struct{}), make(chan struct{})
	var received atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- s.WatchLedger(ctx, ledger.Watch{SKUs: []string{sku}, Consumer: "lagging"}, func(d ledger.Delivery) error {
			if d.Entry == nil {
				return nil
			}
			if d.Entry.IdempotencyKey == "lag-1" {
				close(held)
				<-hold // the consumer holds the page
			}
			received.Add(1)
			return nil
		})
	}()
	for received.Load() < 1 && ctx.Err() == nil {
		time.Sleep(streamPoll)
	}
	// Three entries in one transaction, lagAge old when it commits: one
	// page of three, none received.
	tx, err := b.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		insertEntry(t, tx, sku, fmt.Sprintf("lag-%d", i))
	}
	time.Sleep(lagAge)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the watch never received lag-1")
	}
	entries, _ := lagGauge(t, reg, "shardstock_watch_lag_entries")
	seconds, _ := lagGauge(t, reg, "shardstock_watch_lag_seconds")
	if entries != 3 || seconds < lagAge.Seconds() || seconds > 10 {
		t.Errorf("lag while the consumer holds a page of 3 entries %s old: %v entries, %v s; want 3, and %v to 10 s", lagAge, entries, seconds, lagAge.Seconds())
	}
	close(hold)
	for received.Load() < 4 && ctx.Err() == nil {
		time.Sleep(streamPoll)
	}
	time.Sleep(2 * streamPoll) // the page's send returned: its lag is cleared after it
	entries, _ = lagGauge(t, reg, "shardstock_watch_lag_entries")
	seconds, _ = lagGauge(t, reg, "shardstock_watch_lag_seconds")
	if entries != 0 || seconds != 0 {
		t.Errorf("lag once the consumer received every entry: %v entries, %v s; want 0 and 0", entries, seconds)
	}
	cancel()
	<-done
	if _, ok := lagGauge(t, reg, "shardstock_watch_lag_entries"); ok {
		t.Error("the lag of a consumer that left is still exported")
	}
}

// lagGauge returns the value of metric name for the consumer "lagging",
// and whether it is exported.
func lagGauge(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == "lagging" {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}
