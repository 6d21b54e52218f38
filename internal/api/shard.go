// Package api holds shardstock's Connect handlers: thin conversions
// between the generated API and one domain call each.
package api

import (
	"context"
	"strings"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// executeOpsMax bounds the operations of one Execute call.
const executeOpsMax = 4096

// ShardHandler serves ShardService over a shard.Server.
type ShardHandler struct {
	Server *shard.Server
}

var _ shardstockv1connect.ShardServiceHandler = (*ShardHandler)(nil)

// Execute applies every op through its shard's writer. Invalid ops get their
// own error result; the others are applied.
func (h *ShardHandler) Execute(ctx context.Context, req *connect.Request[v1.ExecuteRequest]) (*connect.Response[v1.ExecuteResponse], error) {
	ops := req.Msg.GetOps()
	if len(ops) > executeOpsMax {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "at most %d ops per call", executeOpsMax))
	}
	out := &v1.ExecuteResponse{Results: make([]*v1.ShardResult, len(ops))}
	reqs, at := make([]*stock.Request, 0, len(ops)), make([]int, 0, len(ops))
	for i, op := range ops {
		r := wire.RequestFromProto(op)
		if !claimable(r) {
			out.Results[i] = wire.ResultToProto(stock.Result{Err: stock.Errorf(stock.CodePermissionDenied,
				"source %q is not one a caller %q may claim", r.Source, r.Caller)})
			continue
		}
		reqs, at = append(reqs, r), append(at, i)
	}
	for j, r := range h.Server.DoAll(ctx, reqs) {
		out.Results[at[j]] = wire.ResultToProto(r)
	}
	return connect.NewResponse(out), nil
}

// claimable says whether an op from the wire may name its source: the
// allocator's own (api, allocator, rebalancer, order, admission; empty is api); an
// operator's (admin:NAME) only for a caller the allocator verified as an
// admin; never the sweeper's, which only a shard server's own sweeps name.
// Who may call at all is the listener's to decide (mTLS: allocators'
// certificates only).
func claimable(r *stock.Request) bool {
	switch r.Source {
	case "", stock.SourceAPI, stock.SourceAllocator, stock.SourceRebalancer, stock.SourceOrder, stock.SourceAdmission:
		return true
	}
	return strings.HasPrefix(r.Source, stock.SourceAdminPrefix) && strings.HasPrefix(r.Caller, auth.RoleAdmin.String()+":")
}

// GetShards answers shard counts.
func (h *ShardHandler) GetShards(ctx context.Context, req *connect.Request[v1.GetShardsRequest]) (*connect.Response[v1.GetShardsResponse], error) {
	if err := stock.ValidateSKU(req.Msg.GetSku()); err != nil {
		return nil, wire.ToConnect(err)
	}
	if len(req.Msg.GetShards()) > stock.ShardsMax {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "at most %d shards", stock.ShardsMax))
	}
	out := &v1.GetShardsResponse{}
	for _, idx := range req.Msg.GetShards() {
		c, err := h.Server.Counts(ctx, stock.ShardKey{SKU: req.Msg.GetSku(), Index: idx})
		if err != nil {
			return nil, wire.ToConnect(err)
		}
		out.Shards = append(out.Shards, &v1.ShardStock{Index: idx, ServerId: h.Server.ID(), Available: c.Available, Reserved: c.Reserved, Sold: c.Sold})
	}
	return connect.NewResponse(out), nil
}
