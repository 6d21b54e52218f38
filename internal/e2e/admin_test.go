package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// sharedAdmin (TestE2E_Shared/Admin): stock adjustments are idempotent and
// ledgered with their reason and approver, the ledger pages, the topology
// lists every owner, and health, readiness and metrics answer.
func sharedAdmin(t *testing.T, s *stack) {
	ctx := context.Background()
	const sku = "adm"
	s.createSKU(sku, 40, 4)

	t.Run("AdjustStock", func(t *testing.T) {
		adj := func(delta int64, key string) (*v1.AdjustStockResponse, error) {
			resp, err := s.admin.AdjustStock(ctx, adminReq(&v1.AdjustStockRequest{Sku: sku, Delta: delta, Reason: "recount", Approver: "alice", IdempotencyKey: key}))
			if err != nil {
				return nil, err
			}
			return resp.Msg, nil
		}
		if r, err := adj(5, "adj-1"); err != nil || r.Replayed || r.Stock.Available != 45 {
			t.Fatalf("AdjustStock(+5) = %v, %v, want available 45", r, err)
		}
		if r, err := adj(5, "adj-1"); err != nil || !r.Replayed || r.Stock.Available != 45 {
			t.Errorf("AdjustStock(+5) again = %v, %v, want a replay, available 45", r, err)
		}
		if r, err := adj(-15, "adj-2"); err != nil || r.Stock.Available != 30 {
			t.Errorf("AdjustStock(-15), more than any one shard = %v, %v, want available 30", r, err)
		}
		if _, err := adj(-1000, "adj-3"); reason(err) != "OUT_OF_STOCK" {
			t.Errorf("AdjustStock(-1000) = %v, want OUT_OF_STOCK", err)
		}
		for _, m := range []*v1.AdjustStockRequest{
			{Sku: sku, Delta: 1, Approver: "alice", IdempotencyKey: "adj-4"},
			{Sku: sku, Delta: 1, Reason: "recount", IdempotencyKey: "adj-4"},
			{Sku: sku, Delta: 0, Reason: "recount", Approver: "alice", IdempotencyKey: "adj-4"},
		} {
			if _, err := s.admin.AdjustStock(ctx, adminReq(m)); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("AdjustStock(%v) = %v, want invalid_argument", m, err)
			}
		}
		if st := s.stock(sku); st.Available != 30 {
			t.Errorf("available = %d, want 30", st.Available)
		}
		s.reconcile(sku)
	})
	t.Run("SetShardsAndRebalance", func(t *testing.T) {
		resp, err := s.admin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: sku, Shards: 8}))
		if err != nil || resp.Msg.Sku.Shards != 8 || resp.Msg.Stock.ShardsInService != 8 || len(resp.Msg.Stock.Shards) != 8 {
			t.Fatalf("SetShards(8) = %v, %v, want 8 shards in service", resp, err)
		}
		plan, err := s.admin.Rebalance(ctx, adminReq(&v1.RebalanceRequest{Sku: sku, DryRun: true}))
		if err != nil && reason(err) != "REBALANCE_IN_PROGRESS" {
			t.Fatalf("Rebalance(dry run) = %v", err)
		}
		for _, tr := range plan.Msg.GetTransfers() {
			if tr.State != v1.TransferState_TRANSFER_STATE_PLANNED || tr.TransferId != "" {
				t.Errorf("dry-run transfer %v, want planned with no id", tr)
			}
		}
		if _, err := s.admin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: sku, Shards: 257})); reason(err) != "INVALID_ARGUMENT" {
			t.Errorf("SetShards(257) = %v, want INVALID_ARGUMENT", err)
		}
		if _, err := s.admin.SetShards(ctx, adminReq(&v1.SetShardsRequest{Sku: "no-such-sku", Shards: 2})); reason(err) != "SKU_NOT_FOUND" {
			t.Errorf("SetShards(no such sku) = %v, want SKU_NOT_FOUND", err)
		}
		if _, err := s.admin.Rebalance(ctx, adminReq(&v1.RebalanceRequest{Sku: "no-such-sku"})); reason(err) != "SKU_NOT_FOUND" {
			t.Errorf("Rebalance(no such sku) = %v, want SKU_NOT_FOUND", err)
		}
		s.reconcile(sku)
	})
	t.Run("ListLedger", func(t *testing.T) {
		var all []*v1.LedgerEntry
		token := ""
		for page := 0; page < 20; page++ {
			resp, err := s.admin.ListLedger(ctx, adminReq(&v1.ListLedgerRequest{Sku: sku, PageToken: token, PageSize: 2}))
			if err != nil {
				t.Fatalf("ListLedger = %v", err)
			}
			all = append(all, resp.Msg.Entries...)
			if token = resp.Msg.NextPageToken; token == "" {
				break
			}
		}
		var adjusts int
		for i, e := range all {
			if i > 0 && e.Id <= all[i-1].Id {
				t.Errorf("entry %d after %d: pages out of order", e.Id, all[i-1].Id)
			}
			if e.Kind == "adjust" {
				adjusts++
				if e.Reason != "recount" || e.Approver != "alice" || e.Source != "admin:alice" || e.ServerId == "" || e.Epoch == 0 {
					t.Errorf("adjust entry %v lacks its reason, approver, source, server or epoch", e)
				}
			}
		}
		if adjusts < 2 {
			t.Errorf("adjust entries = %d, want at least 2 (+5, and -15 over shards after a consolidation)", adjusts)
		}
		if _, err := s.admin.ListLedger(ctx, adminReq(&v1.ListLedgerRequest{Sku: sku, PageToken: "!!"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("ListLedger with a bad token = %v, want invalid_argument", err)
		}
	})
	t.Run("Topology", func(t *testing.T) {
		resp, err := s.admin.GetTopology(ctx, adminReq(&v1.GetTopologyRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Partitions != 256 || len(resp.Msg.Owners) != 256 || len(resp.Msg.Servers) != len(s.shards) {
			t.Errorf("topology: %d partitions, %d owners, %d servers; want 256, 256, %d", resp.Msg.Partitions, len(resp.Msg.Owners), len(resp.Msg.Servers), len(s.shards))
		}
	})
	t.Run("HealthReadyMetrics", func(t *testing.T) {
		for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "shardstock_rpc_calls_total"} {
			base := s.base
			if path == "/metrics" {
				base = s.ops // the operator listener's, never the public port's
			}
			resp, err := http.Get(base + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
				t.Errorf("GET %s = %d %.80q, want 200 with %q", path, resp.StatusCode, body, want)
			}
			if path != "/metrics" {
				continue
			}
			for _, gauge := range []string{"shardstock_units_in_transit ", `shardstock_db_pool_connections{database="main",state="max"} 4`, "shardstock_rebalancer_leases_held "} {
				if !strings.Contains(string(body), gauge) {
					t.Errorf("/metrics has no %s", gauge)
				}
			}
		}
		// The public port serves no metrics and no profiles.
		for _, path := range []string{"/metrics", "/debug/pprof/"} {
			resp, err := http.Get(s.base + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET %s on the public port = %d, want 404", path, resp.StatusCode)
			}
		}
		resp, err := http.Post(s.base+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader(`{"service":"shardstock.v1.InventoryService"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "SERVING_STATUS_SERVING") {
			t.Errorf("health check = %s, want SERVING", body)
		}
	})
}
