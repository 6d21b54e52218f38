package api

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/stock"
)

// recordingInventory records the requests that reach it.
type recordingInventory struct {
	Inventory
	got []*stock.Request
}

func (r *recordingInventory) Allocate(_ context.Context, req *stock.Request) stock.Result {
	r.got = append(r.got, req)
	return stock.Result{Operation: &stock.Operation{SKU: req.Shard.SKU}}
}

// A stock-changing call names its caller, never the secret, in the
// request the ledger records and in the log at info, whoever calls; a
// public caller counts as its verified customer.
func TestInventoryHandler_Caller(t *testing.T) {
	const secret = "service-token-0123456789"
	for _, tc := range []struct {
		name         string
		caller       auth.Caller
		wantCaller   string
		wantCustomer string
	}{
		{"Service", auth.Caller{Role: auth.RoleService, ID: auth.TokenID(secret)}, "service:" + auth.TokenID(secret), "sent-ref"},
		{"ServiceCert", auth.Caller{Role: auth.RoleService, ID: "cert:orders"}, "service:cert:orders", "sent-ref"},
		{"Admin", auth.Caller{Role: auth.RoleAdmin, ID: "jwt:alice"}, "admin:jwt:alice", "sent-ref"},
		{"Public", auth.Caller{Role: auth.RolePublic, ID: "jwt:bob", Customer: "bob"}, "public:jwt:bob", "bob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			inv := &recordingInventory{}
			h := &InventoryHandler{Inventory: inv, Log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
			ctx := auth.WithCaller(context.Background(), tc.caller)
			if _, err := h.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "s", Quantity: 1, IdempotencyKey: "k", CustomerRef: "sent-ref"})); err != nil {
				t.Fatal(err)
			}
			if r := inv.got[0]; r.Caller != tc.wantCaller || r.CustomerRef != tc.wantCustomer {
				t.Errorf("request caller %q customer %q, want %q %q", r.Caller, r.CustomerRef, tc.wantCaller, tc.wantCustomer)
			}
			if got := buf.String(); !strings.Contains(got, "level=INFO msg=\"stock call\" call=Deduct caller="+tc.wantCaller) || strings.Contains(got, secret) {
				t.Errorf("log at info = %q, want Deduct's line with the caller %s and no secret", got, tc.wantCaller)
			}
		})
	}
}

// TestPolicy_Admission: the admission calls are open to the public role
// in every deployment, RequestToken and CancelTicket with a verified
// customer only; the other InventoryService calls stay the service's.
func TestPolicy_Admission(t *testing.T) {
	p, err := NewPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		proc     string
		role     auth.Role
		customer bool
	}{
		{shardstockv1connect.InventoryServiceRequestTokenProcedure, auth.RolePublic, true},
		{shardstockv1connect.InventoryServiceCancelTicketProcedure, auth.RolePublic, true},
		{shardstockv1connect.InventoryServiceGetTicketProcedure, auth.RolePublic, false},
		{shardstockv1connect.InventoryServiceWatchTicketProcedure, auth.RolePublic, false},
		{shardstockv1connect.InventoryServiceGetDrawProcedure, auth.RolePublic, false},
		{shardstockv1connect.InventoryServiceReserveProcedure, auth.RoleService, false},
	} {
		if role, customer := p.Need(tc.proc); role != tc.role || customer != tc.customer {
			t.Errorf("Need(%s) = %v, %v; want %v, %v", tc.proc, role, customer, tc.role, tc.customer)
		}
	}
}

// countingHandler counts the records it is handed and formats none.
type countingHandler struct{ n *int }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	*h.n++
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// BenchmarkAudit: what building a stock call's audit line costs the call,
// the handler's work (startup.AuditLog's queue and writer) left out.
func BenchmarkAudit(b *testing.B) {
	var n int
	log := slog.New(countingHandler{&n})
	ctx := context.Background()
	r := &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "hot"}, Quantity: 1, Key: "k-1", Caller: "service:token:3f2a9c1b0d4e"}
	res := stock.Result{Err: stock.Errorf(stock.CodeOutOfStock, "out of stock")}
	for b.Loop() {
		audit(ctx, log, "Deduct", r, res)
	}
	if n != b.N {
		b.Fatalf("%d lines for %d calls", n, b.N)
	}
}
