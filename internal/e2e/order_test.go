package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

// TestE2E_OrderDriverKilled: an allocator process driving a 5-line order,
// its lines placed alternately on the databases main and second, stops
// itself after four lines are held (the test-only failpoint
// order-line-4, SIGSTOP) and is killed there (SIGKILL). Within
// allocator.OrderRecoveryBound of the kill the stack's other allocator
// has released every held line and failed the order: nothing held,
// nothing sold (released, never both), and the books balance; a retry of
// the order's key through that allocator answers the order's one
// outcome, again and again.
//
// Seen failing with the other allocator's recovery off (recoverOrders
// returning at once): "order ... still pending, lines held ... after
// 9.5s".
func TestE2E_OrderDriverKilled(t *testing.T) {
	ctx := context.Background()
	second := pgtest.NewMigratedDB(t)
	s := newStackOpts(t, stackOpts{shardServers: 2, env: []string{"SHARDSTOCK_DATABASES=second=" + second}})

	// Five SKUs, in name order (the order the driver takes them in),
	// placed main, second, main, second, main; each in its database only.
	placement, err := stock.Placement{}.Next([]string{stock.DefaultDatabase, "second"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{stock.DefaultDatabase, "second", stock.DefaultDatabase, "second", stock.DefaultDatabase}
	var skus []string
	for i := 0; len(skus) < len(want) && i < 1000; i++ {
		if name := fmt.Sprintf("killord-%03d", i); placement.Newest(name) == want[len(skus)] {
			skus = append(skus, name)
		}
	}
	if len(skus) < len(want) {
		t.Fatalf("no SKU names placed %v", want)
	}
	const initial = 10
	urls := map[string]string{stock.DefaultDatabase: s.dbURL, "second": second}
	for i, sku := range skus {
		s.createSKU(sku, initial, 1)
		for db, url := range urls {
			if n := countSKU(t, url, sku); n != map[bool]int{true: 1, false: 0}[db == want[i]] {
				t.Fatalf("%s: %d rows in database %s; placed on %s", sku, n, db, want[i])
			}
		}
	}

	driver := s.startEnv("driver", []string{"SHARDSTOCK_FAILPOINT=order-line-4=stop"}, filepath.Join(bin, "allocator"),
		"-addr", "127.0.0.1:0", "-admin-token", adminToken, "-service-token", serviceToken, "-log-level", "warn", "-db-max-conns", "4")
	dinv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), driver.waitReady(t, readiness.RoleAllocator).Addr, asService)

	req := &v1.ReserveOrderRequest{IdempotencyKey: "killed-cart", OrderRef: "killed-cart"}
	for i, sku := range skus {
		req.Lines = append(req.Lines, &v1.OrderLine{Sku: sku, Quantity: int64(i + 1)})
	}
	driven := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		_, err := dinv.ReserveOrder(dctx, connect.NewRequest(req))
		driven <- err
	}()
	driver.waitLine(t, "failpoint: order-line-4")

	// First prove the stop landed midway: the order pending, its first
	// four lines held (two in each database), the fifth not.
	got, err := s.inv.GetOrder(ctx, connect.NewRequest(&v1.GetOrderRequest{IdempotencyKey: "killed-cart"}))
	if err != nil || got.Msg.Order.GetState() != v1.OrderState_ORDER_STATE_PENDING {
		t.Fatalf("GetOrder(killed-cart) at the stop = %v, %v; want pending", got, err)
	}
	orderID := got.Msg.Order.OrderId
	for i, sku := range skus {
		if st := s.stock(sku); st.Reserved != map[bool]int64{true: int64(i + 1), false: 0}[i < 4] {
			t.Fatalf("%s (line %d) at the stop: %v; want lines 0-3 held, line 4 not", sku, i, st)
		}
	}
	driver.stop(syscall.SIGKILL)
	killed := time.Now()
	if err := <-driven; err == nil {
		t.Errorf("ReserveOrder through the killed driver answered success")
	}

	// Within the bound: the order failed, every line given back.
	var state v1.OrderState
	var held int64
	for {
		got, err := s.inv.GetOrder(ctx, connect.NewRequest(&v1.GetOrderRequest{OrderId: orderID}))
		if err != nil {
			t.Fatalf("GetOrder(%s) = %v", orderID, err)
		}
		state, held = got.Msg.Order.GetState(), 0
		for _, sku := range skus {
			held += s.stock(sku).Reserved
		}
		if state == v1.OrderState_ORDER_STATE_FAILED && held == 0 {
			break
		}
		if time.Since(killed) > allocator.OrderRecoveryBound {
			t.Fatalf("order %s still %v, lines held %d units, %s after its driver was killed (OrderRecoveryBound)", orderID, state, held, allocator.OrderRecoveryBound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the killed driver's order failed and its four lines, in two databases, were released %s after the kill", time.Since(killed).Round(time.Millisecond))

	// Released, never both: nothing sold, all back; the books balance.
	for _, sku := range skus {
		if st := s.stock(sku); st.Available != initial || st.Reserved != 0 || st.Sold != 0 {
			t.Errorf("%s after the recovery = %v, want all %d available, none sold", sku, st, initial)
		}
		s.reconcile(sku)
	}

	// A retry of the key, through the other allocator, answers the order's
	// one outcome: failed, as the recovery left it, naming the order; and
	// takes nothing.
	for range 2 {
		_, err := s.inv.ReserveOrder(ctx, connect.NewRequest(req))
		// ORDER_FAILED, definite: a retry that follows docs/api.md must not
		// be told SHARD_UNAVAILABLE (send the same key again) for good.
		if r, md := reason(err), errorMetadata(err); r != string(stock.CodeOrderFailed) || md["order_id"] != orderID || md["cause"] != string(stock.CodeShardUnavailable) {
			t.Errorf("ReserveOrder(killed-cart) again = %v (%s, %v); want the failed order %s's ORDER_FAILED, cause SHARD_UNAVAILABLE", err, r, md, orderID)
		}
	}
	for _, sku := range skus {
		if st := s.stock(sku); st.Available != initial {
			t.Errorf("%s after the retries = %v, want all %d available", sku, st, initial)
		}
	}
}

// errorMetadata returns the ErrorInfo metadata of a Connect error, or nil.
func errorMetadata(err error) map[string]string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.Metadata
			}
		}
	}
	return nil
}
