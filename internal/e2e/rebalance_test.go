package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/transport"
)

// traffic is continuous deduct and reserve/commit/release traffic through
// the public API, each request retried with its key while the answer is
// retryable. It counts the units it sold and fails the test on any answer
// that is neither a success nor retryable.
type traffic struct {
	t    *testing.T
	inv  shardstockv1connect.InventoryServiceClient
	sku  string
	sold atomic.Int64
	ops  atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup
}

func startTraffic(t *testing.T, inv shardstockv1connect.InventoryServiceClient, sku string, clients int) *traffic {
	tr := &traffic{t: t, inv: inv, sku: sku, stop: make(chan struct{})}
	for c := range clients {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				key := fmt.Sprintf("%s-c%d-%d", sku, c, n)
				q := int64(1 + n%3)
				switch n % 3 {
				case 0:
					if tr.retry("Deduct", func(ctx context.Context) error {
						_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: q, IdempotencyKey: key}))
						return err
					}) {
						tr.sold.Add(q)
					}
				default:
					tr.reserveAndEnd(key, q, n%3 == 1)
				}
				tr.ops.Add(1)
			}
		}()
	}
	return tr
}

// reserveAndEnd reserves q and commits or releases the reservation.
func (tr *traffic) reserveAndEnd(key string, q int64, commit bool) {
	var id string
	if !tr.retry("Reserve", func(ctx context.Context) error {
		resp, err := tr.inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: tr.sku, Quantity: q, IdempotencyKey: key}))
		if err == nil {
			id = resp.Msg.Reservation.ReservationId
		}
		return err
	}) {
		return
	}
	if commit {
		if tr.retry("Commit", func(ctx context.Context) error {
			_, err := tr.inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: id}))
			return err
		}) {
			tr.sold.Add(q)
		}
		return
	}
	tr.retry("Release", func(ctx context.Context) error {
		_, err := tr.inv.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: id, Reason: "test"}))
		return err
	})
}

// retry calls f until it succeeds or answers a non-retryable error (a test
// failure), for at most 30 s; it reports success.
func (tr *traffic) retry(what string, f func(context.Context) error) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := f(ctx)
		cancel()
		switch code := connect.CodeOf(err); {
		case err == nil:
			return true
		case code == connect.CodeUnavailable, code == connect.CodeAborted, code == connect.CodeDeadlineExceeded:
			time.Sleep(10 * time.Millisecond)
		default:
			tr.t.Errorf("%s on %s: %v (reason %s), not retryable", what, tr.sku, err, reason(err))
			return false
		}
	}
	tr.t.Errorf("%s on %s: still retryable after 30 s", what, tr.sku)
	return false
}

func (tr *traffic) finish() {
	close(tr.stop)
	tr.wg.Wait()
}

// conserved fails the test unless the SKU's counts add up to initial.
func conserved(t *testing.T, st *v1.Stock, initial int64) {
	t.Helper()
	if got := st.Available + st.Reserved + st.Sold + st.InTransit; got != initial {
		t.Errorf("available %d + reserved %d + sold %d + in transit %d = %d, want %d", st.Available, st.Reserved, st.Sold, st.InTransit, got, initial)
	}
}

// waitStock polls GetStock until ok holds, for at most timeout.
func (s *stack) waitStock(sku string, timeout time.Duration, what string, ok func(*v1.Stock) bool) *v1.Stock {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := s.stock(sku)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not within %s; stock %v", what, timeout, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestE2E_SetShardsUnderTraffic: a SKU goes from 4 shards to 32 and back to
// 2 while deducts and reserve/commit/release pairs flow through the public
// API. No request fails for a non-retryable reason, the units sold are
// exactly those acknowledged, Reconcile balances after each step, and the
// shards retired with held reservations retire once those end.
func TestE2E_SetShardsUnderTraffic(t *testing.T) {
	s := newStackOpts(t, stackOpts{shardServers: 2, ttl: leaseTTL, allocArgs: []string{"-retire-grace", "1s", "-auto-shards=false"}})
	ctx := context.Background()
	const sku, initial = "resh", 1_000_000
	s.createSKU(sku, initial, 4)
	tr := startTraffic(t, s.inv, sku, 6)
	time.Sleep(time.Second)

	grow, err := s.admin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: sku, Shards: 32}))
	if err != nil || grow.Msg.Stock.ShardsInService != 32 {
		t.Fatalf("SetShards(32) = %v, %v", grow, err)
	}
	s.waitStock(sku, 15*time.Second, "stock on 24 of 32 shards", func(st *v1.Stock) bool {
		holding := 0
		for _, sh := range st.Shards {
			if sh.Available > 0 {
				holding++
			}
		}
		return holding >= 24
	})
	s.reconcile(sku)

	// Held reservations, some on shards that the shrink will retire.
	var held []*v1.Reservation
	onRetiring := 0
	for i := 0; i < 40 && onRetiring < 4; i++ {
		resp, err := s.inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: fmt.Sprintf("held-%d", i), Ttl: durationpb.New(10 * time.Minute)}))
		if err != nil {
			t.Fatalf("Reserve(held-%d) = %v", i, err)
		}
		held = append(held, resp.Msg.Reservation)
		if resp.Msg.Reservation.Shard >= 2 {
			onRetiring++
		}
	}
	if onRetiring == 0 {
		t.Fatal("no held reservation on a shard at index 2 or above")
	}

	shrink, err := s.admin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: sku, Shards: 2}))
	if err != nil || shrink.Msg.Stock.ShardsInService != 2 {
		t.Fatalf("SetShards(2) = %v, %v", shrink, err)
	}
	if _, err := s.admin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: sku, Shards: 1})); reason(err) != "SHARDS_RETIRING" {
		t.Errorf("SetShards(1) while shards retire = %v, want SHARDS_RETIRING", err)
	}
	// The retiring shards' stock moves away; those with held reservations
	// stay listed, retiring, until the reservations end.
	st := s.waitStock(sku, 20*time.Second, "retiring shards drained", func(st *v1.Stock) bool {
		for _, sh := range st.Shards {
			if sh.Index >= 2 && sh.Available > 0 {
				return false
			}
		}
		return true
	})
	retiring := 0
	for _, sh := range st.Shards {
		if sh.Index >= 2 {
			if sh.State != v1.ShardState_SHARD_STATE_RETIRING {
				t.Errorf("shard %d state %v, want retiring", sh.Index, sh.State)
			}
			if sh.Reserved > 0 {
				retiring++
			}
		}
	}
	if retiring == 0 {
		t.Errorf("no retiring shard listed with its held reservations: %v", st.Shards)
	}
	s.reconcile(sku)
	for i, r := range held {
		var err error
		if i%2 == 0 {
			_, err = s.inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: r.ReservationId}))
			tr.sold.Add(1)
		} else {
			_, err = s.inv.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: r.ReservationId, Reason: "test"}))
		}
		if err != nil {
			t.Fatalf("ending held reservation %s on shard %d = %v", r.ReservationId, r.Shard, err)
		}
	}
	s.waitStock(sku, 30*time.Second, "shards retired", func(st *v1.Stock) bool { return len(st.Shards) == 2 })
	tr.finish()
	st = s.waitStock(sku, 15*time.Second, "nothing in transit", func(st *v1.Stock) bool { return st.InTransit == 0 })
	conserved(t, st, initial)
	if st.Sold != tr.sold.Load() {
		t.Errorf("sold %d, acknowledged %d", st.Sold, tr.sold.Load())
	}
	s.reconcile(sku)
	t.Logf("%d operations through the public API, %d units sold; shards 4 -> 32 -> 2", tr.ops.Load(), st.Sold)
}

// TestE2E_MoverKilledAtEachStep: an allocator moving a SKU's stock is
// killed (SIGKILL) at each step of its transfers, one SKU per step: with
// the move lease held and its fence raised but nothing written
// ("before-create"), with its transfers pending ("created"), between their
// debit and their credit ("debited"), and after their credit with the
// lease still held ("credited"). Every transfer left half-way ends
// credited (the shard servers' sweep finishes it), and conservation holds
// at every sample taken meanwhile through another allocator.
func TestE2E_MoverKilledAtEachStep(t *testing.T) {
	s := newStack(t, 2)
	ctx := context.Background()
	const initial = 1000
	steps := []struct {
		point string
		want  v1.TransferState // what the killed mover left; UNSPECIFIED: no transfer at all
	}{
		{"before-create", v1.TransferState_TRANSFER_STATE_UNSPECIFIED},
		{"created", v1.TransferState_TRANSFER_STATE_PENDING},
		{"debited", v1.TransferState_TRANSFER_STATE_DEBITED},
		{"credited", v1.TransferState_TRANSFER_STATE_CREDITED},
	}
	var mu sync.Mutex
	var skus []string
	var samples, bad atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			mu.Lock()
			now := slices.Clone(skus)
			mu.Unlock()
			for _, sku := range now {
				resp, err := s.inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
				if err != nil {
					continue
				}
				samples.Add(1)
				if st := resp.Msg.Stock; st.Available+st.Reserved+st.Sold+st.InTransit != initial {
					bad.Add(1)
					t.Errorf("sample: %v does not add up to %d", st, initial)
				}
			}
		}
	})

	left := map[string][]*v1.Transfer{} // SKU -> transfers open at the kill
	for _, step := range steps {
		sku := "killmv-" + step.point
		s.createSKU(sku, initial, 1)
		mu.Lock()
		skus = append(skus, sku)
		mu.Unlock()
		mover := s.startEnv("mover-"+step.point, []string{"SHARDSTOCK_FAILPOINT=" + step.point + "=10m"}, filepath.Join(bin, "allocator"),
			"-addr", "127.0.0.1:0", "-admin-token", adminToken, "-log-level", "warn", "-db-max-conns", "4", "-rebalance=false", "-auto-shards=false")
		base := mover.waitReady(t, readiness.RoleAllocator).Addr
		madmin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
		if _, err := madmin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: sku, Shards: 4})); err != nil {
			t.Fatalf("SetShards(%s, 4) through the mover = %v", sku, err)
		}
		mover.waitLine(t, "failpoint: "+step.point)
		var at []*v1.Transfer
		if step.want != v1.TransferState_TRANSFER_STATE_UNSPECIFIED {
			at = s.waitTransfers(sku, step.want, 5*time.Second)
			if len(at) == 0 {
				t.Fatalf("%s: no transfer %v at the failpoint", step.point, step.want)
			}
		}
		if step.want == v1.TransferState_TRANSFER_STATE_CREDITED {
			// The mover runs its transfers at once (one per new shard: 1 to
			// 4) and each stops at the failpoint after its own credit: the
			// first to get there is not the last, whose units are in transit
			// until it does, nor is every transfer even created by then.
			at = s.waitCredited(sku, 3, 5*time.Second)
		}
		mover.stop(syscall.SIGKILL)
		all := s.transfers(sku, v1.TransferState_TRANSFER_STATE_UNSPECIFIED)
		if step.want == v1.TransferState_TRANSFER_STATE_UNSPECIFIED && len(all) != 0 {
			t.Errorf("%s: transfers written before the failpoint that precedes them: %v", step.point, all)
		}
		st := s.stock(sku)
		if inTransit := step.want == v1.TransferState_TRANSFER_STATE_DEBITED; (st.InTransit > 0) != inTransit {
			t.Errorf("%s: in transit %d after the kill", step.point, st.InTransit)
		}
		left[sku] = at
	}

	// The shard servers' sweep finishes what was left (transferStaleAge, 5 s).
	deadline := time.Now().Add(30 * time.Second)
	for _, sku := range skus {
		for {
			open := append(s.transfers(sku, v1.TransferState_TRANSFER_STATE_DEBITED), s.transfers(sku, v1.TransferState_TRANSFER_STATE_PENDING)...)
			if len(open) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: transfers still open 30 s after the mover died: %v", sku, open)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	for sku, at := range left {
		now := map[string]*v1.Transfer{}
		for _, tr := range s.transfers(sku, v1.TransferState_TRANSFER_STATE_UNSPECIFIED) {
			now[tr.TransferId] = tr
		}
		for _, tr := range at {
			if end := now[tr.TransferId]; end.GetState() != v1.TransferState_TRANSFER_STATE_CREDITED {
				t.Errorf("%s: transfer %s, %v when the mover died, did not end credited: now %v", sku, tr.TransferId, tr.State, end)
			}
		}
		conserved(t, s.stock(sku), initial)
		s.reconcile(sku)
	}
	t.Logf("movers killed at %d steps; %d samples of conservation meanwhile, %d wrong", len(steps), samples.Load(), bad.Load())
}

// transfers lists a SKU's transfers in a state.
func (s *stack) transfers(sku string, state v1.TransferState) []*v1.Transfer {
	s.t.Helper()
	resp, err := s.admin.ListTransfers(context.Background(), adminReq(&v1.ListTransfersRequest{Sku: sku, State: state, PageSize: 1000}))
	if err != nil {
		s.t.Fatalf("ListTransfers(%s, %v) = %v", sku, state, err)
	}
	return resp.Msg.Transfers
}

// waitCredited waits until sku has n credited transfers and none pending
// or debited, and returns the credited ones.
func (s *stack) waitCredited(sku string, n int, timeout time.Duration) []*v1.Transfer {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		// One listing of every state: one view of them all.
		open := 0
		var credited []*v1.Transfer
		for _, t := range s.transfers(sku, v1.TransferState_TRANSFER_STATE_UNSPECIFIED) {
			switch t.GetState() {
			case v1.TransferState_TRANSFER_STATE_PENDING, v1.TransferState_TRANSFER_STATE_DEBITED:
				open++
			case v1.TransferState_TRANSFER_STATE_CREDITED:
				credited = append(credited, t)
			}
		}
		if open == 0 && len(credited) >= n || time.Now().After(deadline) {
			return credited
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitTransfers waits until a SKU has transfers in a state and returns them.
func (s *stack) waitTransfers(sku string, state v1.TransferState, timeout time.Duration) []*v1.Transfer {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if ts := s.transfers(sku, state); len(ts) > 0 || time.Now().After(deadline) {
			return ts
		}
		time.Sleep(20 * time.Millisecond)
	}
}
