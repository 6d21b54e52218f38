package allocatorcmd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/transport"
)

// TestRun_AuditLine: at -log-level info, a service's Deduct writes its
// audit line (-audit-log async, the default) with its caller by
// credential id, never the token; an admin's AdjustStock writes its
// "admin call" line likewise.
func TestRun_AuditLine(t *testing.T) {
	ctx := context.Background()
	var stderr cmdtest.Output
	base, _ := startLogging(t, pgtest.NewMigratedDB(t), &stderr, "-shard-id", "own", "-lease-ttl", "2s", "-log-level", "info")
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	hc := transport.NewClient()
	admin := shardstockv1connect.NewAdminServiceClient(hc, base, bearer(token))
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "audited", InitialStock: 10, Shards: 1})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	service := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(serviceToken))
	if _, err := service.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "audited", Quantity: 1, IdempotencyKey: "by-service"})); err != nil {
		t.Fatalf("Deduct = %v", err)
	}
	if _, err := admin.AdjustStock(ctx, connect.NewRequest(&v1.AdjustStockRequest{Sku: "audited", Delta: 2, Reason: "found a box", Approver: "alice",
		IdempotencyKey: "by-admin"})); err != nil {
		t.Fatalf("AdjustStock = %v", err)
	}
	want := `msg="stock call" call=Deduct caller=service:` + auth.TokenID(serviceToken) + ` sku=audited key=by-service`
	// An admin call is logged in the call, with its caller and outcome.
	wantAdmin := `msg="admin call" call=/shardstock.v1.AdminService/AdjustStock caller=admin:` + auth.TokenID(token) + ` outcome=ok`
	// The writer writes within its flush interval (50 ms): the bound is
	// far above it, not a timing.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), want) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := stderr.String(); !strings.Contains(got, want) || !strings.Contains(got, wantAdmin) || strings.Contains(got, serviceToken) || strings.Contains(got, token) {
		t.Errorf("log = %q, want the Deduct's line %q, the AdjustStock's %q, and never a token", got, want, wantAdmin)
	}
}
