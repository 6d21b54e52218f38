package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestE2E_ErrorReasons produces every error reason of the brief (rate
// limits aside) through the public API, each with its Connect code, and
// checks that none changed stock.
func TestE2E_ErrorReasons(t *testing.T) {
	besideOthers(t)
	s := newStack(t, 2)
	ctx := context.Background()
	const sku = "errs"
	s.createSKU(sku, 10, 2, func(r *v1.CreateSkuRequest) { r.MaxPerOrder = 5 })
	s.createSKU("errs-limited", 10, 1, func(r *v1.CreateSkuRequest) { r.CustomerLimit = 3 })
	s.createSKU("errs-paused", 10, 1)
	s.createSKU("errs-small", 2, 2)
	paused := true
	if _, err := s.admin.UpdateSku(ctx, adminReq(&v1.UpdateSkuRequest{Sku: "errs-paused", Paused: &paused})); err != nil {
		t.Fatal(err)
	}
	deduct := func(sku string, q int64, key string) error {
		_, err := s.deduct(ctx, sku, key, q)
		return err
	}
	reserve := func(q int64, key string, ttl time.Duration) (*v1.Reservation, error) {
		m := &v1.ReserveRequest{Sku: sku, Quantity: q, IdempotencyKey: key}
		if ttl > 0 {
			m.Ttl = durationpb.New(ttl)
		}
		resp, err := s.inv.Reserve(ctx, connect.NewRequest(m))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Reservation, nil
	}
	commit := func(id string) error {
		_, err := s.inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: id}))
		return err
	}
	release := func(id string) error {
		_, err := s.inv.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: id}))
		return err
	}
	must := func(r *v1.Reservation, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("Reserve = %v", err)
		}
		return r.ReservationId
	}

	if err := deduct(sku, 1, "first"); err != nil {
		t.Fatal(err)
	}
	committed := must(reserve(1, "to-commit", 0))
	if err := commit(committed); err != nil {
		t.Fatal(err)
	}
	released := must(reserve(1, "to-release", 0))
	if err := release(released); err != nil {
		t.Fatal(err)
	}
	expired := must(reserve(1, "to-expire", time.Second))
	// Wait for the sweeper to expire the hold, so that nothing below may
	// change stock.
	for deadline := time.Now().Add(10 * time.Second); s.stock(sku).Reserved != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not expire the hold")
		}
	}

	before, beforeLimited := s.stock(sku), s.stock("errs-limited")
	for _, tc := range []struct {
		reason string
		code   connect.Code
		call   func() error
	}{
		{"INVALID_SKU", connect.CodeInvalidArgument, func() error { return deduct("bad sku!", 1, "k") }},
		{"INVALID_SKU", connect.CodeInvalidArgument, func() error { return deduct("", 1, "k") }},
		{"INVALID_SKU", connect.CodeInvalidArgument, func() error { return deduct(strings.Repeat("s", stock.SKULenMax+1), 1, "k") }},
		{"INVALID_QUANTITY", connect.CodeInvalidArgument, func() error { return deduct(sku, 0, "k") }},
		{"INVALID_QUANTITY", connect.CodeInvalidArgument, func() error { return deduct(sku, -1, "k") }},
		{"INVALID_QUANTITY", connect.CodeInvalidArgument, func() error { return deduct(sku, stock.QuantityMax+1, "k") }},
		{"INVALID_IDEMPOTENCY_KEY", connect.CodeInvalidArgument, func() error { return deduct(sku, 1, "") }},
		{"INVALID_IDEMPOTENCY_KEY", connect.CodeInvalidArgument, func() error { return deduct(sku, 1, "a\tb") }},
		{"INVALID_IDEMPOTENCY_KEY", connect.CodeInvalidArgument, func() error { return deduct(sku, 1, strings.Repeat("k", 129)) }},
		{"QUANTITY_ABOVE_MAX_PER_ORDER", connect.CodeInvalidArgument, func() error { return deduct(sku, 6, "k") }},
		{"IDEMPOTENCY_KEY_REUSED", connect.CodeInvalidArgument, func() error { return deduct(sku, 2, "first") }},
		{"SKU_NOT_FOUND", connect.CodeNotFound, func() error { return deduct("no-such-sku", 1, "k") }},
		{"RESERVATION_NOT_FOUND", connect.CodeNotFound, func() error { return commit("r1.bm9wZQ.0.000000000000000000000000") }},
		{"RESERVATION_NOT_FOUND", connect.CodeNotFound, func() error { return release("garbage") }},
		{"OPERATION_NOT_FOUND", connect.CodeNotFound, func() error {
			_, err := s.inv.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: sku, IdempotencyKey: "never-used"}))
			return err
		}},
		{"OUT_OF_STOCK", connect.CodeFailedPrecondition, func() error { return deduct("errs-small", 3, "too-many") }},
		{"SKU_PAUSED", connect.CodeFailedPrecondition, func() error { return deduct("errs-paused", 1, "on-paused") }},
		{"RESERVATION_EXPIRED", connect.CodeFailedPrecondition, func() error { return commit(expired) }},
		{"RESERVATION_ALREADY_COMMITTED", connect.CodeFailedPrecondition, func() error { return release(committed) }},
		{"RESERVATION_ALREADY_RELEASED", connect.CodeFailedPrecondition, func() error { return commit(released) }},
		{"CUSTOMER_LIMIT_REACHED", connect.CodeFailedPrecondition, func() error {
			_, err := s.inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "errs-limited", Quantity: 4, IdempotencyKey: "greedy", CustomerRef: "carol"}))
			return err
		}},
		{"CUSTOMER_REF_REQUIRED", connect.CodeInvalidArgument, func() error { return deduct("errs-limited", 1, "anonymous") }},
		{"CUSTOMER_REF_REQUIRED", connect.CodeInvalidArgument, func() error {
			_, err := s.inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: "errs-limited", Quantity: 1, IdempotencyKey: "anonymous-hold"}))
			return err
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			err := tc.call()
			if reason(err) != tc.reason || connect.CodeOf(err) != tc.code {
				t.Errorf("got %v (reason %q), want %s %s", err, reason(err), tc.code, tc.reason)
			}
			if err != nil && strings.Contains(strings.ToLower(err.Error()), "sql") {
				t.Errorf("error %q leaks SQL", err)
			}
		})
	}
	// Not even a shard's counts moved (a consolidating transfer would).
	if after := s.stock("errs-limited"); !proto.Equal(after, beforeLimited) {
		t.Errorf("stock %v -> %v: the refused calls changed it", beforeLimited, after)
	}
	if after := s.stock(sku); !proto.Equal(after, before) {
		t.Errorf("stock %v -> %v: the refused calls changed it", before, after)
	}
	after := s.stock(sku)

	t.Run("OPERATION_IN_PROGRESS", func(t *testing.T) {
		// Hold the partition row of shard 0 so its next batch waits, then
		// ask for the state of the waiting key.
		conn, err := pgx.Connect(ctx, s.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		s.createSKU("errs-slow", 10, 1)
		if _, err := tx.Exec(ctx, "SELECT 1 FROM partitions WHERE partition = $1 FOR UPDATE", stock.PartitionOf("errs-slow", 0)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := s.deduct(ctx, "errs-slow", "slow-1", 1); done <- err }()
		var got error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_, got = s.inv.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: "errs-slow", IdempotencyKey: "slow-1"}))
			if reason(got) == "OPERATION_IN_PROGRESS" {
				break
			}
		}
		if reason(got) != "OPERATION_IN_PROGRESS" || connect.CodeOf(got) != connect.CodeAborted {
			t.Errorf("GetOperation of a waiting key = %v, want aborted OPERATION_IN_PROGRESS", got)
		}
		tx.Rollback(ctx)
		if err := <-done; err != nil {
			t.Errorf("Deduct after the lock went = %v", err)
		}
		if resp, err := s.inv.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: "errs-slow", IdempotencyKey: "slow-1"})); err != nil || resp.Msg.Operation.Quantity != 1 {
			t.Errorf("GetOperation after = %v, %v", resp, err)
		}
	})
	t.Run("Unauthenticated", func(t *testing.T) {
		for _, hdr := range []string{"", "Bearer wrong-token-0123456789", "Basic " + adminToken, "Bearer"} {
			req := connect.NewRequest(&v1.AdjustStockRequest{Sku: sku, Delta: 100, Reason: "x", Approver: "y", IdempotencyKey: "adj"})
			if hdr != "" {
				req.Header().Set("Authorization", hdr)
			}
			if _, err := s.admin.AdjustStock(ctx, req); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("AdjustStock with %q = %v, want unauthenticated", hdr, err)
			}
		}
		if got := s.stock(sku); got.Available != after.Available {
			t.Errorf("an unauthenticated adjustment changed stock: %v -> %v", after, got)
		}
	})
	t.Run("SHARD_UNAVAILABLE", func(t *testing.T) {
		for _, p := range s.shards {
			p.stop(syscall.SIGKILL)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if _, err = s.deduct(rctx, sku, "when-down", 1); reason(err) == "SHARD_UNAVAILABLE" {
				break
			}
		}
		if reason(err) != "SHARD_UNAVAILABLE" || connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("Deduct with every shard server dead = %v, want unavailable SHARD_UNAVAILABLE", err)
		}
	})
}
