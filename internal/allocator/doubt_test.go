package allocator_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

// cutAfterDelivery is an allocator's link to its shard servers that fails
// the first Execute call carrying key once the call has been delivered and
// queued(): the server holds the op, the allocator is told the call failed,
// as after a ping timeout, a reset or an abandoned call. The call itself
// goes on (its stream stays open until its deadline), as a server that
// already took an op goes on with it.
type cutAfterDelivery struct {
	base   http.RoundTripper
	key    []byte
	queued func() bool
	done   atomic.Bool // the cut has landed
	armed  atomic.Bool // the first call carrying key was seen
}

// cutWaitMax bounds the wait for the cut call's op to be queued.
const cutWaitMax = 10 * time.Second

func (c *cutAfterDelivery) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil {
		return c.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if !bytes.Contains(body, c.key) || !c.armed.CompareAndSwap(false, true) {
		return c.base.RoundTrip(req)
	}
	// Deliver it on a context of its own (the deadline travels in the
	// request's timeout header), and give up on it once the server has
	// queued the op.
	sent := req.Clone(context.WithoutCancel(req.Context()))
	go func() {
		if resp, err := c.base.RoundTrip(sent); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	for deadline := time.Now().Add(cutWaitMax); !c.queued(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, errors.New("cutAfterDelivery: the op was never queued")
		}
	}
	c.done.Store(true)
	return nil, errors.New("cutAfterDelivery: connection lost after delivery")
}

// queueDepth returns the requests waiting in shard server id's writers.
func (s *stack) queueDepth(id string) float64 {
	s.t.Helper()
	return s.gauge(id, "shardstock_shard_queue_depth")
}

// gauge returns the value of shard server id's gauge name.
func (s *stack) gauge(id, name string) float64 {
	s.t.Helper()
	mfs, err := s.metrics[id].Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	s.t.Fatalf("shard server %s has no %s", id, name)
	return 0
}

// waitingOnLock reports whether a backend other than the caller's waits
// for a lock.
func waitingOnLock(t *testing.T, conn *pgx.Conn) bool {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// waitUntil waits for cond, at most cutWaitMax.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(cutWaitMax); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached in %s", cutWaitMax)
		}
	}
}

// doubtAnswerTimeout is the deadline of the request whose outcome is in
// doubt: the shard that holds it cannot decide it before the test lets it.
const doubtAnswerTimeout = 2 * time.Second

// TestAllocator_InDoubt: a deduct whose call to the shard holding the only
// unit fails after the shard queued it (behind the release of a hold on
// that unit, waiting for a row lock) is not answered OUT_OF_STOCK although
// the other shard refuses it and the sold-out check finds nothing available, since
// the first shard then applies it; and GetOperation does not answer
// OPERATION_NOT_FOUND meanwhile, since a client would buy again under a new
// key. A retry with the same key gets the deduct's first result.
func TestAllocator_InDoubt(t *testing.T) {
	s := newStack(t, []string{"s1"}, "")
	ctx := context.Background()
	const sku = "doubt"
	s.createSKU(sku, 2, 1)
	held := int32(0)
	if s.available(sku)[0] == 0 {
		held = 1
	}
	hold := s.alloc.Allocate(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: "hold"})
	if hold.Err != nil || hold.Reservation.Shard != held {
		t.Fatalf("Allocate(reserve hold) = %+v, want a hold on shard %d", hold, held)
	}

	// The other shard refuses a deduct now, and so has a writer that
	// refuses the next one from memory and one read of its key, without a
	// transaction (a transaction would queue behind the held shard's).
	other := 1 - held
	if res := s.alloc.Allocate(ctx, deduct(sku, keyFor(t, "probe", 2, other), 1)); codeOf(res) != stock.CodeOutOfStock {
		t.Fatalf("Allocate(deduct probe) with the only unit held = %+v, want OUT_OF_STOCK", res)
	}

	// Lock the held shard's row: the release of the hold waits for it in
	// its batch, and the deduct queues behind it.
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM shards WHERE sku = $1 AND idx = $2 FOR UPDATE`, sku, held); err != nil {
		t.Fatal(err)
	}
	released := make(chan stock.Result, 1)
	go func() {
		released <- s.alloc.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: hold.Reservation.ID})
	}()
	watch, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	waitUntil(t, func() bool { return waitingOnLock(t, watch) })

	// Another allocator, whose call with the deduct is cut once s1 queued it.
	key := keyFor(t, "buy", 2, held)
	link := &cutAfterDelivery{base: transport.NewInternalClient().Transport, key: []byte(key),
		queued: func() bool { return s.queueDepth("s1") >= 1 }}
	a := allocator.New(allocator.Config{DB: s.db, Topology: s.topo, Logger: quiet(), HTTPClient: &http.Client{Transport: link},
		Rebalance: rebalance.Config{Off: true, Auto: rebalance.AutoShards{Off: true}}})
	t.Cleanup(a.Close)
	dctx, cancel := context.WithTimeout(ctx, doubtAnswerTimeout)
	got := a.Allocate(dctx, deduct(sku, key, 1))
	cancel()
	if !link.done.Load() {
		t.Fatalf("the call carrying %s was not cut after delivery (Allocate = %+v): the fault did not land", key, got)
	}
	t.Logf("Allocate(deduct %s) with its call cut after delivery = %+v", key, got.Err)
	_, opErr := a.GetOperation(ctx, sku, key)

	// Let shard s1 go on: the release returns the unit, and the queued
	// deduct takes it.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res := <-released; res.Err != nil {
		t.Fatalf("EndReservation(release hold) = %v", res.Err)
	}
	var applied *stock.Operation
	waitUntil(t, func() bool {
		applied, err = s.db.GetOperation(ctx, sku, key)
		return err == nil
	})
	if applied.Shard != held {
		t.Fatalf("the deduct was applied on shard %d, want %d, the one whose call was cut", applied.Shard, held)
	}

	// The deduct was applied after its request was answered: that answer
	// must not have been a refusal.
	if got.Err != nil && got.Err.Code != stock.CodeShardUnavailable {
		t.Errorf("Allocate(deduct %s) = %v, want success or SHARD_UNAVAILABLE: shard %d applied it afterwards", key, got.Err, held)
	}
	if c := codeOfErr(opErr); c != stock.CodeOperationInProgress {
		t.Errorf("GetOperation(%s) while shard %d held the deduct = %v, want OPERATION_IN_PROGRESS", key, held, opErr)
	}
	again := a.Allocate(ctx, deduct(sku, key, 1))
	if again.Err != nil || !again.Replayed || again.Operation.Shard != held {
		t.Errorf("Allocate(deduct %s) again = %+v, want a replay of shard %d's deduct", key, again, held)
	}
	s.balanced(sku)
}
