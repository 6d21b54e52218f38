package api

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/wire"
)

// fakeAdmin records the rebalancer's calls and answers them as told. The
// handler tests here check what a handler refuses before it calls Admin and
// how it converts what Admin answers; the allocator behind the real Admin
// is tested against Postgres and etcd in internal/allocator and
// internal/e2e. A call it does not override panics (the embedded nil
// interface): a handler that should not reach it fails the test.
type fakeAdmin struct {
	Admin
	calls []string

	stock     *stock.Stock
	transfers []*stock.Transfer
	leases    []stock.MoveLease
	err       error

	gotSKU    string
	gotShards int32
	gotDryRun bool
	gotFilter stock.TransferFilter
}

func (f *fakeAdmin) SetShards(_ context.Context, sku string, shards int32) (*stock.Stock, error) {
	f.calls = append(f.calls, "SetShards")
	f.gotSKU, f.gotShards = sku, shards
	return f.stock, f.err
}

func (f *fakeAdmin) Rebalance(_ context.Context, sku string, dryRun bool) ([]*stock.Transfer, error) {
	f.calls = append(f.calls, "Rebalance")
	f.gotSKU, f.gotDryRun = sku, dryRun
	return f.transfers, f.err
}

func (f *fakeAdmin) ListTransfers(_ context.Context, flt stock.TransferFilter, _ string, _ int) ([]*stock.Transfer, error) {
	f.calls = append(f.calls, "ListTransfers")
	f.gotFilter = flt
	return f.transfers, f.err
}

func (f *fakeAdmin) MoveLeases(context.Context) ([]stock.MoveLease, error) {
	f.calls = append(f.calls, "MoveLeases")
	return f.leases, f.err
}

func (f *fakeAdmin) Topology() topology.View { return topology.View{} }

var when = time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC)

// wantRefused fails unless err has the Connect code and reason and the
// handler called nothing.
func wantRefused(t *testing.T, call string, err error, code connect.Code, reason stock.Code, f *fakeAdmin) {
	t.Helper()
	if connect.CodeOf(err) != code || wire.Reason(err) != string(reason) {
		t.Errorf("%s = %v (reason %q), want %v, reason %s", call, err, wire.Reason(err), code, reason)
	}
	if len(f.calls) != 0 {
		t.Errorf("%s called %v, want nothing called", call, f.calls)
	}
}

func TestAdminHandler_SetShards(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		req    *v1.SetShardsRequest
		reason stock.Code
	}{
		{"ShardsZero", &v1.SetShardsRequest{Sku: "s", Shards: 0}, stock.CodeInvalidArgument},
		{"ShardsNegative", &v1.SetShardsRequest{Sku: "s", Shards: -1}, stock.CodeInvalidArgument},
		{"ShardsAboveMax", &v1.SetShardsRequest{Sku: "s", Shards: stock.ShardsMax + 1}, stock.CodeInvalidArgument},
		{"BadSKU", &v1.SetShardsRequest{Sku: "bad name", Shards: 4}, stock.CodeInvalidSKU},
		{"NoSKU", &v1.SetShardsRequest{Shards: 4}, stock.CodeInvalidSKU},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAdmin{}
			_, err := (&AdminHandler{Admin: f}).SetShards(ctx, connect.NewRequest(tc.req))
			wantRefused(t, "SetShards("+tc.req.String()+")", err, connect.CodeInvalidArgument, tc.reason, f)
		})
	}
	t.Run("OK", func(t *testing.T) {
		f := &fakeAdmin{stock: &stock.Stock{
			SKU:   &stock.SKU{Name: "s", Status: stock.StatusActive, Shards: 2, ShardSpan: 3, ReservationTTL: time.Minute},
			Total: stock.Counts{Available: 9, Reserved: 1},
			Shards: []stock.ShardStock{
				{Index: 0, ServerID: "shard-1", Counts: stock.Counts{Available: 5}},
				{Index: 1, ServerID: "shard-2", Counts: stock.Counts{Available: 4}},
				{Index: 2, ServerID: "shard-1", Counts: stock.Counts{Reserved: 1}, Retiring: true},
			},
			Moving: []*stock.Transfer{{ID: "t1", SKU: "s", From: 2, To: 0, Quantity: 3, State: stock.TransferDebited,
				FenceToken: 8, CreatedAt: when, UpdatedAt: when}},
			Mover: &stock.MoveLease{SKU: "s", Holder: "allocator-1", Token: 8},
		}}
		resp, err := (&AdminHandler{Admin: f}).SetShards(ctx, connect.NewRequest(&v1.SetShardsRequest{Sku: "s", Shards: 2}))
		if err != nil {
			t.Fatalf("SetShards(s, 2) = %v", err)
		}
		if f.gotSKU != "s" || f.gotShards != 2 {
			t.Errorf("SetShards(s, 2) called Admin.SetShards(%q, %d), want (s, 2)", f.gotSKU, f.gotShards)
		}
		got := resp.Msg.GetStock()
		want := &v1.Stock{Sku: "s", Available: 9, Reserved: 1, Status: v1.SkuStatus_SKU_STATUS_ACTIVE, ShardsInService: 2,
			Shards: []*v1.ShardStock{
				{Index: 0, ServerId: "shard-1", Available: 5, State: v1.ShardState_SHARD_STATE_SERVING},
				{Index: 1, ServerId: "shard-2", Available: 4, State: v1.ShardState_SHARD_STATE_SERVING},
				{Index: 2, ServerId: "shard-1", Reserved: 1, State: v1.ShardState_SHARD_STATE_RETIRING},
			},
			Moving: []*v1.Transfer{wire.TransferToProto(f.stock.Moving[0])},
			Mover:  &v1.MoveLease{Sku: "s", Holder: "allocator-1", Token: 8},
		}
		if !proto.Equal(got, want) {
			t.Errorf("SetShards(s, 2).Stock = %v, want %v", got, want)
		}
		if cfg := resp.Msg.GetSku(); cfg.GetSku() != "s" || cfg.GetShards() != 2 {
			t.Errorf("SetShards(s, 2).Sku = %v, want sku s, 2 shards", cfg)
		}
	})
	t.Run("AdminError", func(t *testing.T) {
		f := &fakeAdmin{err: stock.Errorf(stock.CodeShardsRetiring, "shards 2..3 are still retiring")}
		_, err := (&AdminHandler{Admin: f}).SetShards(ctx, connect.NewRequest(&v1.SetShardsRequest{Sku: "s", Shards: 1}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || wire.Reason(err) != string(stock.CodeShardsRetiring) {
			t.Errorf("SetShards(s, 1) = %v (reason %q), want failed_precondition, SHARDS_RETIRING", err, wire.Reason(err))
		}
	})
}

func TestAdminHandler_Rebalance(t *testing.T) {
	ctx := context.Background()
	t.Run("DryRun", func(t *testing.T) {
		f := &fakeAdmin{transfers: []*stock.Transfer{{SKU: "s", From: 0, To: 3, Quantity: 7, State: stock.TransferPlanned}}}
		resp, err := (&AdminHandler{Admin: f}).Rebalance(ctx, connect.NewRequest(&v1.RebalanceRequest{Sku: "s", DryRun: true}))
		if err != nil {
			t.Fatalf("Rebalance(s, dry run) = %v", err)
		}
		if f.gotSKU != "s" || !f.gotDryRun {
			t.Errorf("Rebalance(s, dry run) called Admin.Rebalance(%q, %v), want (s, true)", f.gotSKU, f.gotDryRun)
		}
		want := &v1.RebalanceResponse{Transfers: []*v1.Transfer{
			{Sku: "s", FromShard: 0, ToShard: 3, Quantity: 7, State: v1.TransferState_TRANSFER_STATE_PLANNED},
		}}
		if !proto.Equal(resp.Msg, want) {
			t.Errorf("Rebalance(s, dry run) = %v, want %v", resp.Msg, want)
		}
	})
	t.Run("InProgress", func(t *testing.T) {
		f := &fakeAdmin{err: stock.Errorf(stock.CodeRebalanceInProgress, "another allocator moves s")}
		_, err := (&AdminHandler{Admin: f}).Rebalance(ctx, connect.NewRequest(&v1.RebalanceRequest{Sku: "s"}))
		if connect.CodeOf(err) != connect.CodeAborted || wire.Reason(err) != string(stock.CodeRebalanceInProgress) {
			t.Errorf("Rebalance(s) = %v (reason %q), want aborted, REBALANCE_IN_PROGRESS", err, wire.Reason(err))
		}
	})
}

func TestAdminHandler_ListTransfers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		state v1.TransferState
		want  stock.TransferState
	}{
		{"AllStates", v1.TransferState_TRANSFER_STATE_UNSPECIFIED, ""},
		{"Aborted", v1.TransferState_TRANSFER_STATE_ABORTED, stock.TransferAborted},
		{"Debited", v1.TransferState_TRANSFER_STATE_DEBITED, stock.TransferDebited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAdmin{}
			if _, err := (&AdminHandler{Admin: f}).ListTransfers(ctx, connect.NewRequest(&v1.ListTransfersRequest{Sku: "s", State: tc.state})); err != nil {
				t.Fatalf("ListTransfers(s, %v) = %v", tc.state, err)
			}
			if want := (stock.TransferFilter{SKU: "s", State: tc.want}); f.gotFilter != want {
				t.Errorf("ListTransfers(s, %v) called Admin.ListTransfers with %+v, want %+v", tc.state, f.gotFilter, want)
			}
		})
	}
	t.Run("UnknownState", func(t *testing.T) {
		f := &fakeAdmin{}
		_, err := (&AdminHandler{Admin: f}).ListTransfers(ctx, connect.NewRequest(&v1.ListTransfersRequest{Sku: "s", State: 99}))
		wantRefused(t, "ListTransfers(state 99)", err, connect.CodeInvalidArgument, stock.CodeInvalidArgument, f)
	})
}

func TestAdminHandler_GetTopology(t *testing.T) {
	ctx := context.Background()
	t.Run("MoveLeases", func(t *testing.T) {
		f := &fakeAdmin{leases: []stock.MoveLease{{SKU: "a", Holder: "allocator-1", Token: 5}, {SKU: "b", Holder: "allocator-2", Token: 9}}}
		resp, err := (&AdminHandler{Admin: f}).GetTopology(ctx, connect.NewRequest(&v1.GetTopologyRequest{}))
		if err != nil {
			t.Fatalf("GetTopology() = %v", err)
		}
		want := []*v1.MoveLease{{Sku: "a", Holder: "allocator-1", Token: 5}, {Sku: "b", Holder: "allocator-2", Token: 9}}
		got := resp.Msg.GetMoveLeases()
		if len(got) != len(want) {
			t.Fatalf("GetTopology().MoveLeases = %v, want %v", got, want)
		}
		for i := range want {
			if !proto.Equal(got[i], want[i]) {
				t.Errorf("GetTopology().MoveLeases[%d] = %v, want %v", i, got[i], want[i])
			}
		}
	})
	t.Run("MoveLeasesFail", func(t *testing.T) {
		f := &fakeAdmin{err: stock.Errorf(stock.CodeShardUnavailable, "etcd unreachable")}
		_, err := (&AdminHandler{Admin: f}).GetTopology(ctx, connect.NewRequest(&v1.GetTopologyRequest{}))
		if connect.CodeOf(err) != connect.CodeUnavailable || wire.Reason(err) != string(stock.CodeShardUnavailable) {
			t.Errorf("GetTopology() = %v (reason %q), want unavailable, SHARD_UNAVAILABLE", err, wire.Reason(err))
		}
	})
}
