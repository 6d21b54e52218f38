package api

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
)

// A shard server takes from the wire only the sources its caller may
// claim: an operator's only with an admin caller, never the sweeper's.
func TestClaimable(t *testing.T) {
	for _, tc := range []struct {
		source, caller string
		want           bool
	}{
		{"", "", true},
		{stock.SourceAPI, "service:token:3f2a9c1b0d4e", true},
		{stock.SourceRebalancer, "", true},
		{stock.SourceAllocator, "", true},
		{stock.SourceOrder, "service:token:3f2a9c1b0d4e", true},
		{"admin:alice", "admin:jwt:alice", true},
		{"admin:alice", "", false},
		{"admin:anyone", "service:token:3f2a9c1b0d4e", false},
		{"admin:anyone", "public:jwt:mallory", false},
		{"admin:anyone", "administrator", false},
		{stock.SourceSweeper, "", false},
		{"root", "admin:token:3f2a9c1b0d4e", false},
	} {
		if got := claimable(&stock.Request{Source: tc.source, Caller: tc.caller}); got != tc.want {
			t.Errorf("claimable(source %q, caller %q) = %v, want %v", tc.source, tc.caller, got, tc.want)
		}
	}
}

// Execute answers an op whose source its caller may not claim with
// PERMISSION_DENIED and hands it to no writer.
func TestShardHandler_RefusesClaims(t *testing.T) {
	h := &ShardHandler{} // no server: a refused op reaches none
	resp, err := h.Execute(context.Background(), connect.NewRequest(&v1.ExecuteRequest{Ops: []*v1.ShardOp{
		{Kind: v1.ShardOpKind_SHARD_OP_KIND_ADJUST, Sku: "s", Quantity: 1_000_000_000_000, IdempotencyKey: "k", Reason: "x", Approver: "y", Source: "admin:anyone"},
		{Kind: v1.ShardOpKind_SHARD_OP_KIND_REPLENISH, Sku: "s", Quantity: 1, IdempotencyKey: "k2", Source: stock.SourceSweeper},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Msg.GetResults() {
		if got := r.GetError().GetReason(); got != string(stock.CodePermissionDenied) {
			t.Errorf("op %d: %v, want PERMISSION_DENIED", i, r)
		}
	}
}
