package api

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
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
