package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// ledgerConsumer is a WatchLedger consumer attached to a stack throughout a
// fault test: it keeps the cursor of the last message it received and
// resumes from it whenever its stream ends (the allocator lost Postgres, a
// network error) or it is killed (kill: it drops its stream, as a consumer
// process that dies would). What it receives is kept session by session: a
// session is one stream, from its request to its end.
type ledgerConsumer struct {
	s   *stack
	sku string

	mu       sync.Mutex
	cursor   string
	sessions [][]*v1.LedgerEntry
	ends     []error            // how each session that was not killed ended
	cancel   context.CancelFunc // the current session's
	kills    int
}

// Bounds of a ledgerConsumer.
const (
	// consumerResumePause is how long the consumer waits before it resumes
	// a stream that ended: the allocator may be without Postgres for a
	// while, and a resume every few milliseconds would only spin.
	consumerResumePause = 100 * time.Millisecond
	// consumerCatchUpMax bounds how long after the load the consumer may
	// take to receive the whole ledger: its lag is a poll interval and a
	// few pages, so seconds is generous.
	consumerCatchUpMax = 20 * time.Second
)

// attachConsumer starts a consumer of sku's entries on s; it runs until the
// test ends or stop is called.
func attachConsumer(t *testing.T, s *stack, sku string) (c *ledgerConsumer, stop func()) {
	t.Helper()
	c = &ledgerConsumer{s: s, sku: sku}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			c.session(ctx)
			pause(ctx, consumerResumePause)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return c, stop
}

// session watches from the consumer's cursor until the stream ends or the
// consumer is killed.
func (c *ledgerConsumer) session(ctx context.Context) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.Lock()
	c.sessions, c.cancel = append(c.sessions, nil), cancel
	n, cursor := len(c.sessions)-1, c.cursor
	c.mu.Unlock()
	stream, err := c.s.admin.WatchLedger(sctx, adminReq(&v1.WatchLedgerRequest{Cursor: cursor, Skus: []string{c.sku}, Consumer: "e2e-faults"}))
	if err == nil {
		for stream.Receive() {
			m := stream.Msg()
			c.mu.Lock()
			if m.Entry != nil {
				c.sessions[n] = append(c.sessions[n], m.Entry)
			}
			// The consumer handles the entry, then keeps the cursor after it.
			c.cursor = m.Cursor
			c.mu.Unlock()
		}
		err = stream.Err()
		stream.Close()
	}
	if sctx.Err() != nil {
		return // killed, or stopped
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ends = append(c.ends, err)
}

// kill ends the consumer's current session as if its process died: the
// stream is dropped, and the next session resumes from the last cursor.
func (c *ledgerConsumer) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kills++
	c.cancel()
}

// received returns the ids of the entries received in any session; the
// caller holds c.mu.
func (c *ledgerConsumer) received() map[int64]bool {
	got := map[int64]bool{}
	for _, s := range c.sessions {
		for _, e := range s {
			got[e.Id] = true
		}
	}
	return got
}

// check waits until the consumer has received every entry of its SKU's
// ledger, then stops it and checks what it received: every entry of the
// ledger and no other, none twice within a session (again only after a
// resume, at least once), at least kills sessions killed, and, taken in
// the order first received, each shard's entries a chain (each begins
// where the one before it ended).
func (c *ledgerConsumer) check(t *testing.T, stop func(), kills int) {
	t.Helper()
	want := map[int64]bool{}
	for _, e := range c.s.ledger(c.sku) {
		want[e.Id] = true
	}
	start := time.Now()
	for deadline := start.Add(consumerCatchUpMax); ; time.Sleep(50 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.received())
		c.mu.Unlock()
		if n >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the consumer received %d of the ledger's %d entries within %s of the load's end", n, len(want), consumerCatchUpMax)
			break
		}
	}
	caughtUp := time.Since(start)
	stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.received()
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
	if c.kills < kills {
		t.Errorf("the consumer was killed %d times, want %d", c.kills, kills)
	}
	type counts struct{ available, reserved, sold int64 }
	chains := map[int32]counts{}
	seen, again := map[int64]bool{}, 0
	for i, s := range c.sessions {
		inSession := map[int64]bool{}
		for _, e := range s {
			if inSession[e.Id] {
				t.Errorf("session %d received entry %d twice", i, e.Id)
			}
			inSession[e.Id] = true
			if seen[e.Id] {
				again++
				continue // again after a resume: at least once
			}
			seen[e.Id] = true
			before := counts{e.AvailableBefore, e.ReservedBefore, e.SoldBefore}
			if last, ok := chains[e.Shard]; ok && last != before {
				t.Errorf("shard %d: entry %d (%s) starts at %+v, the one received before it ended at %+v", e.Shard, e.Id, e.Kind, before, last)
			}
			chains[e.Shard] = counts{e.AvailableAfter, e.ReservedAfter, e.SoldAfter}
		}
	}
	t.Logf("change stream: %d entries, all received by a consumer in %d sessions (%d killed; ended otherwise: %v), %d received again after a resume; "+
		"the last received %s after the ledger was read", len(want), len(c.sessions), c.kills, c.endedOtherwise(), again, caughtUp.Round(time.Millisecond))
}

// endedOtherwise says how the sessions that were neither killed nor
// stopped ended; the caller holds c.mu.
func (c *ledgerConsumer) endedOtherwise() []string {
	var out []string
	for _, err := range c.ends {
		switch {
		case err == nil:
			out = append(out, "closed by the server")
		case reason(err) != "":
			out = append(out, reason(err))
		default:
			out = append(out, connect.CodeOf(err).String())
		}
	}
	return out
}
