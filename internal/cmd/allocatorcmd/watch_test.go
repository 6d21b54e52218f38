package allocatorcmd_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// TestRun_Watch: the change stream through the allocator's listener.
// WatchStock reports SOLD_OUT within a second of the last unit's sale and
// BACK_IN_STOCK after a replenish, without holding a place among the
// requests in flight (-max-in-flight 1); WatchLedger needs the admin
// token, refuses a forged cursor, and delivers the same entries over
// Connect, gRPC and gRPC-Web, resumable from a cursor; the metrics count
// the consumers and what they were sent.
func TestRun_Watch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ops := cmdtest.FreeAddr(t)
	// A cluster of its own (the later -database-url wins): the stream waits
	// for the whole cluster's oldest transaction (docs/changestream.md).
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-max-in-flight", "1", "-operator-addr", ops,
		"-database-url", pgtest.NewPrivateDBs(t, 1)[0])
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: "watched", InitialStock: 3, Shards: 2})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base, bearer(serviceToken))

	stockStream, err := inv.WatchStock(ctx, connect.NewRequest(&v1.WatchStockRequest{Skus: []string{"watched"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer stockStream.Close()
	events := make(chan *v1.WatchStockResponse, 64)
	go func() {
		defer close(events)
		for stockStream.Receive() {
			events <- stockStream.Msg()
		}
	}()
	next := func(what string, within time.Duration) *v1.WatchStockResponse {
		t.Helper()
		select {
		case m, ok := <-events:
			if !ok {
				t.Fatalf("WatchStock ended waiting for %s: %v", what, stockStream.Err())
			}
			return m
		case <-time.After(within):
			t.Fatalf("no WatchStock message within %s, waiting for %s", within, what)
			return nil
		}
	}
	if m := next("the snapshot", 10*time.Second); m.GetEvent() != v1.StockEvent_STOCK_EVENT_SNAPSHOT || m.GetStock().GetAvailable() != 3 {
		t.Fatalf("first WatchStock message = %v, want a snapshot of 3 available", m)
	}
	// The open watch holds no place: with -max-in-flight 1 these pass.
	for i := range 3 {
		if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "watched", Quantity: 1, IdempotencyKey: fmt.Sprintf("d-%d", i)})); err != nil {
			t.Fatalf("Deduct %d with a watch open and -max-in-flight 1 = %v", i, err)
		}
	}
	soldOut := time.Now()
	for m := next("SOLD_OUT", time.Second); m.GetEvent() != v1.StockEvent_STOCK_EVENT_SOLD_OUT; m = next("SOLD_OUT", time.Second-time.Since(soldOut)) {
		if m.GetEvent() != v1.StockEvent_STOCK_EVENT_CHANGED {
			t.Fatalf("before SOLD_OUT: %v", m)
		}
	}
	if _, err := inv.Replenish(ctx, connect.NewRequest(&v1.ReplenishRequest{Sku: "watched", Quantity: 2, IdempotencyKey: "r-1"})); err != nil {
		t.Fatal(err)
	}
	if m := next("BACK_IN_STOCK", time.Second); m.GetEvent() != v1.StockEvent_STOCK_EVENT_BACK_IN_STOCK || m.GetStock().GetAvailable() != 2 {
		t.Fatalf("after the replenish: %v, want BACK_IN_STOCK with 2 available", m)
	}

	// WatchLedger is the admin's.
	if err := firstErr(admin.WatchLedger(ctx, connect.NewRequest(&v1.WatchLedgerRequest{}))); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("WatchLedger without the token = %v, want unauthenticated", err)
	}
	forged := adminReq(&v1.WatchLedgerRequest{Cursor: "c1.BG1haW4B____________AQ"})
	if err := firstErr(admin.WatchLedger(ctx, forged)); wire.Reason(err) != string(stock.CodeInvalidArgument) {
		t.Errorf("WatchLedger from a forged cursor = %v, want INVALID_ARGUMENT", err)
	}
	wantKeys := []string{"d-0", "d-1", "d-2", "r-1"}
	var cursor string
	for _, proto := range []struct {
		name string
		opt  []connect.ClientOption
	}{{"Connect", nil}, {"GRPC", []connect.ClientOption{connect.WithGRPC()}}, {"GRPCWeb", []connect.ClientOption{connect.WithGRPCWeb()}}} {
		c := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base, proto.opt...)
		keys, last := watchLedger(ctx, t, c, "", "consumer-"+strings.ToLower(proto.name), len(wantKeys))
		if fmt.Sprint(keys) != fmt.Sprint(wantKeys) {
			t.Errorf("%s: WatchLedger received %v, want %v", proto.name, keys, wantKeys)
		}
		cursor = last
	}
	// Resumed from the last cursor: only what came after it.
	if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "watched", Quantity: 1, IdempotencyKey: "d-after"})); err != nil {
		t.Fatal(err)
	}
	if keys, _ := watchLedger(ctx, t, admin, cursor, "", 1); fmt.Sprint(keys) != "[d-after]" {
		t.Errorf("resumed: received %v, want [d-after]", keys)
	}

	// The ledger watches just ended on the client's side; the server's
	// handlers end (and count themselves out) a moment later.
	want := []string{`shardstock_watch_consumers{stream="stock"} 1`, `shardstock_watch_consumers{stream="ledger"} 0`,
		`shardstock_watch_entries_delivered_total{stream="ledger"} 13`}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + ops + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var missing []string
		for _, line := range want {
			if !strings.Contains(string(body), line+"\n") {
				missing = append(missing, line)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %v after 5 s", missing)
		}
	}
}

// watchLedger receives the SKU "watched"'s entries from cursor until it
// has n, and returns their keys and the last cursor.
func watchLedger(ctx context.Context, t *testing.T, c shardstockv1connect.AdminServiceClient, cursor, consumer string, n int) ([]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := c.WatchLedger(ctx, adminReq(&v1.WatchLedgerRequest{Cursor: cursor, Skus: []string{"watched"}, Consumer: consumer}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	for len(keys) < n && s.Receive() {
		if e := s.Msg().GetEntry(); e != nil {
			keys = append(keys, e.GetIdempotencyKey())
			cursor = s.Msg().GetCursor()
		}
	}
	if len(keys) < n {
		t.Fatalf("WatchLedger from %q: %v, then %v", cursor, keys, s.Err())
	}
	return keys, cursor
}

// firstErr is the error a stream ends with before its first message.
func firstErr[T any](s *connect.ServerStreamForClient[T], err error) error {
	if err != nil {
		return err
	}
	defer s.Close()
	if s.Receive() {
		return nil
	}
	return s.Err()
}
