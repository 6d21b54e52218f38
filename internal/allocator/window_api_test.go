package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// serveAPI serves a's InventoryService and AdminService over HTTP/2 on a
// port of its own and returns Connect clients of them.
func (s *stack) serveAPI(a *allocator.Allocator) (shardstockv1connect.InventoryServiceClient, shardstockv1connect.AdminServiceClient) {
	s.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(shardstockv1connect.NewInventoryServiceHandler(&api.InventoryHandler{Inventory: a}, transport.PublicHandlerOptions()...))
	mux.Handle(shardstockv1connect.NewAdminServiceHandler(&api.AdminHandler{Admin: a}, transport.PublicHandlerOptions()...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); transport.Serve(ctx, lis, mux) }()
	s.t.Cleanup(func() { cancel(); <-done })
	base := "http://" + lis.Addr().String()
	return shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base),
		shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
}

// windowCall is one Reserve or Deduct of TestAPI_SaleWindow with the
// database's clock read just before it was sent and just after it was
// answered.
type windowCall struct {
	err           error
	before, after time.Time
}

// windowMeta is the sale window bound in err's ErrorInfo metadata.
func windowMeta(err error, key string) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.GetMetadata()[key]
			}
		}
	}
	return ""
}

// TestAPI_SaleWindow sets a sale window through AdminService.UpdateSku
// that opens 2 s later and calls Reserve and Deduct over Connect, in turn
// through two allocators: before the start every call is
// failed_precondition SALE_NOT_STARTED with the start in its ErrorInfo,
// from the start they sell, and from the end (set through the API too)
// SALE_ENDED with the end. The shard servers' estimate of the database's
// clock is put on the wrong side of each bound (an hour past the start
// while it has not come, an hour before it once it has, past the end
// while it has not): the database's clock decides every answer.
func TestAPI_SaleWindow(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, []string{"s1"}, "")
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	const sku = "api-window"
	s.createSKU(sku, 2, 1000)
	invA, admin := s.serveAPI(s.alloc)
	invB, _ := s.serveAPI(s.newAllocator())
	n := 0
	// call sends the next Reserve or Deduct, through A or B in turn, with
	// the shard server's estimate of the database's clock at about
	// estimate.
	call := func(estimate time.Time) windowCall {
		t.Helper()
		n++
		inv := invA
		if n%2 == 0 {
			inv = invB
		}
		c := windowCall{before: dbNow()}
		s.db.SkewClock(estimate.Sub(c.before))
		key := fmt.Sprintf("w-%04d", n)
		if n%3 == 0 {
			_, c.err = inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: key}))
		} else {
			_, c.err = inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: key}))
		}
		c.after = dbNow()
		return c
	}
	t.Cleanup(func() { s.db.SkewClock(0) })

	start := dbNow().Add(2 * time.Second).Truncate(time.Microsecond)
	if _, err := admin.UpdateSku(ctx, connect.NewRequest(&v1.UpdateSkuRequest{Sku: sku, SaleStart: timestamppb.New(start)})); err != nil {
		t.Fatalf("UpdateSku(sale_start in 2 s) = %v", err)
	}
	wantStart := start.UTC().Format(time.RFC3339Nano)
	_, fellBack0 := s.db.Speculated()
	refused, deadline := 0, time.Now().Add(10*time.Second)
	for {
		c := call(start.Add(time.Hour))
		if c.err == nil {
			if c.after.Before(start) {
				t.Fatalf("call %d answered at %s, before the start %s by the database's clock, sold", n, c.after, start)
			}
			break
		}
		if connect.CodeOf(c.err) != connect.CodeFailedPrecondition || wire.Reason(c.err) != string(stock.CodeSaleNotStarted) || !c.before.Before(start) {
			t.Fatalf("call %d sent at %s (start %s) = %v, want SALE_NOT_STARTED before the start and a sale after", n, c.before, start, c.err)
		}
		if got := windowMeta(c.err, stock.MetaSaleStart); got != wantStart {
			t.Fatalf("call %d: SALE_NOT_STARTED %s = %q, want %q", n, stock.MetaSaleStart, got, wantStart)
		}
		refused++
		if time.Now().After(deadline) {
			t.Fatalf("no sale within 10 s of a start 2 s away")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Speculative groups the database refused prove that the estimate and
	// the database's clock disagreed on the calls they carried.
	if _, fellBack1 := s.db.Speculated(); refused == 0 || fellBack1 == fellBack0 {
		t.Fatalf("%d calls refused, %d speculative groups refused by the database: the clocks never disagreed", refused, fellBack1-fellBack0)
	}
	// Inside the window with the estimate an hour before it: the database
	// sells, at both allocators.
	for range 4 {
		if c := call(start.Add(-time.Hour)); c.err != nil {
			t.Fatalf("call %d inside the window, estimated before it = %v, want a sale", n, c.err)
		}
	}

	end := dbNow().Add(time.Second).Truncate(time.Microsecond)
	if _, err := admin.UpdateSku(ctx, connect.NewRequest(&v1.UpdateSkuRequest{Sku: sku, SaleEnd: timestamppb.New(end)})); err != nil {
		t.Fatalf("UpdateSku(sale_end in 1 s) = %v", err)
	}
	wantEnd := end.UTC().Format(time.RFC3339Nano)
	sold := 0
	for ended := 0; ended < 4; {
		c := call(end.Add(time.Hour))
		switch {
		case c.err == nil:
			if ended > 0 || !c.before.Before(end) {
				t.Fatalf("call %d sent at %s, after the end %s by the database's clock, sold", n, c.before, end)
			}
			sold++
		case connect.CodeOf(c.err) == connect.CodeFailedPrecondition && wire.Reason(c.err) == string(stock.CodeSaleEnded) && !c.after.Before(end):
			if got := windowMeta(c.err, stock.MetaSaleEnd); got != wantEnd {
				t.Fatalf("call %d: SALE_ENDED %s = %q, want %q", n, stock.MetaSaleEnd, got, wantEnd)
			}
			ended++
		default:
			t.Fatalf("call %d answered at %s (end %s) = %v, want a sale before the end and SALE_ENDED after", n, c.after, end, c.err)
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("still selling 10 s after an end 1 s away")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sold == 0 {
		t.Fatalf("no sale between the end set and the end: the estimate past the end was believed")
	}
	t.Logf("%d calls refused SALE_NOT_STARTED, %d sold before the end", refused, sold)
	s.balanced(sku)
}
