package allocatorcmd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// TestRun_DashboardReads: the two reads the dashboard makes of a SKU it
// charts, over Connect against a real allocator. WatchLedger with fromNow
// sends its starting cursor first and then only the entries committed
// after the call, none of the SKU's earlier ledger, and its cursor
// resumes; fromNow with a cursor is refused. ReadMetrics with skus gives
// each SKU's own calls by reason and its latency histogram, not another
// SKU's, and refuses too many or malformed SKUs.
func TestRun_DashboardReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A cluster of its own: the stream waits for the whole cluster's
	// oldest transaction (docs/changestream.md).
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-database-url", pgtest.NewPrivateDBs(t, 1)[0])
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base, bearer(serviceToken))
	deduct := func(sku, key string) error {
		_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: key}))
		return err
	}
	for sku, units := range map[string]int64{"charted": 5, "metered": 1, "other": 3} {
		if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: sku, InitialStock: units, Shards: 2})); err != nil {
			t.Fatalf("CreateSku(%s) = %v", sku, err)
		}
	}

	t.Run("WatchLedgerFromNow", func(t *testing.T) {
		// A ledger before the watch: the SKU's creation and two deducts.
		for i := range 2 {
			if err := deduct("charted", fmt.Sprintf("before-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		s, err := admin.WatchLedger(wctx, adminReq(&v1.WatchLedgerRequest{Skus: []string{"charted"}, Consumer: "from-now", FromNow: true}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Receive() {
			t.Fatalf("WatchLedger(fromNow) ended before its first message: %v", s.Err())
		}
		first := s.Msg()
		if first.GetEntry() != nil || first.GetCursor() == "" {
			t.Fatalf("WatchLedger(fromNow) first message = %v, want its starting cursor alone", first)
		}
		// The watch has started (its first message is sent once it holds
		// its place): what commits now is after it.
		if err := deduct("charted", "after-0"); err != nil {
			t.Fatal(err)
		}
		var keys []string
		var cursor string
		for len(keys) < 1 && s.Receive() {
			if e := s.Msg().GetEntry(); e != nil {
				cursor = s.Msg().GetCursor()
				if e.GetIdempotencyKey() != "" { // not a transfer between the shards (below)
					keys = append(keys, e.GetIdempotencyKey())
				}
			}
		}
		if fmt.Sprint(keys) != "[after-0]" {
			t.Fatalf("WatchLedger(fromNow) received %v (%v), want [after-0] alone: not the ledger before it", keys, s.Err())
		}
		s.Close()
		// Its cursors resume like any: the starting one gives what followed.
		if got, _ := watchSKU(ctx, t, admin, "charted", first.GetCursor(), 1); fmt.Sprint(got) != "[after-0]" {
			t.Errorf("resumed from the starting cursor: %v, want [after-0]", got)
		}
		if err := deduct("charted", "after-1"); err != nil {
			t.Fatal(err)
		}
		if got, _ := watchSKU(ctx, t, admin, "charted", cursor, 1); fmt.Sprint(got) != "[after-1]" {
			t.Errorf("resumed from the last cursor: %v, want [after-1]", got)
		}
		both := adminReq(&v1.WatchLedgerRequest{Cursor: first.GetCursor(), FromNow: true})
		if err := firstErr(admin.WatchLedger(ctx, both)); wire.Reason(err) != string(stock.CodeInvalidArgument) {
			t.Errorf("WatchLedger with a cursor and fromNow = %v, want INVALID_ARGUMENT", err)
		}
	})

	t.Run("ReadMetricsBySKU", func(t *testing.T) {
		// "metered" has one unit: one deduct sells, two are refused;
		// "other" sells three.
		for i := range 3 {
			err := deduct("metered", fmt.Sprintf("metrics-%d", i))
			if want := i >= 1; (wire.Reason(err) == string(stock.CodeOutOfStock)) != want {
				t.Fatalf("Deduct(metered) %d = %v, want out of stock %v", i, err, want)
			}
			if err := deduct("other", fmt.Sprintf("metrics-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		names := []string{transport.SKUCallsFamily, transport.SKUSecondsFamily}
		resp, err := admin.ReadMetrics(ctx, adminReq(&v1.ReadMetricsRequest{Names: names, Skus: []string{"metered"}}))
		if err != nil {
			t.Fatalf("ReadMetrics = %v", err)
		}
		const deductProc = "/shardstock.v1.InventoryService/Deduct"
		got := map[string]float64{}
		for _, s := range resp.Msg.GetSamples() {
			l := s.GetLabels()
			if l["sku"] != "metered" {
				t.Errorf("ReadMetrics(skus: [metered]) holds %s %v", s.GetName(), l)
			}
			if l["procedure"] == deductProc {
				got[s.GetName()+"/"+l["reason"]+l["le"]] = s.GetValue()
			}
		}
		want := map[string]float64{
			transport.SKUCallsFamily + "/OK":            1,
			transport.SKUCallsFamily + "/OUT_OF_STOCK":  2,
			transport.SKUSecondsFamily + "_count/":      3,
			transport.SKUSecondsFamily + "_bucket/+Inf": 3,
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("ReadMetrics(metered) %s = %v, want %v (all: %v)", k, got[k], v, got)
			}
		}
		// Without skus, no per-SKU sample.
		resp, err = admin.ReadMetrics(ctx, adminReq(&v1.ReadMetricsRequest{Names: names}))
		if err != nil || len(resp.Msg.GetSamples()) != 0 {
			t.Errorf("ReadMetrics without skus = %d samples, %v; want none", len(resp.Msg.GetSamples()), err)
		}
		for name, skus := range map[string][]string{
			"TooMany": {"a", "b", "c", "d", "e"},
			"BadSKU":  {"no spaces"},
		} {
			_, err := admin.ReadMetrics(ctx, adminReq(&v1.ReadMetricsRequest{Names: names, Skus: skus}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("%s: ReadMetrics(skus: %q) = %v, want invalid_argument", name, skus, err)
			}
		}
	})
}

// watchSKU receives sku's entries from cursor until it has n, and returns
// their keys and the last cursor.
func watchSKU(ctx context.Context, t *testing.T, c shardstockv1connect.AdminServiceClient, sku, cursor string, n int) ([]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := c.WatchLedger(ctx, adminReq(&v1.WatchLedgerRequest{Cursor: cursor, Skus: []string{sku}}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	for len(keys) < n && s.Receive() {
		if e := s.Msg().GetEntry(); e != nil {
			cursor = s.Msg().GetCursor()
			// The allocator may move stock between the SKU's shards at any
			// time (a transfer's debit and credit, entries with no
			// idempotency key): the keys are the test's own requests.
			if e.GetIdempotencyKey() != "" {
				keys = append(keys, e.GetIdempotencyKey())
			}
		}
	}
	if len(keys) < n {
		t.Fatalf("WatchLedger(%s) from %q: %v, then %v", sku, cursor, keys, s.Err())
	}
	return keys, cursor
}
