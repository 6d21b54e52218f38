package api

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// Inventory is what the InventoryService serves: the allocator, or the
// load generator's in-memory ceiling (bench/internal/loadgen/memory), which so
// goes through the same handlers.
type Inventory interface {
	// Allocate takes units from a shard that has them, which it chooses:
	// a reserve or a deduct (r.Kind).
	Allocate(ctx context.Context, r *stock.Request) stock.Result
	// EndReservation commits, releases or extends a reservation (r.Kind)
	// on the shard its id names.
	EndReservation(ctx context.Context, r *stock.Request) stock.Result
	// Refund gives back units of a sale (r.Original).
	Refund(ctx context.Context, r *stock.Request) stock.Result
	// ReserveOrder holds every line of an order or none; CommitOrder and
	// ReleaseOrder end a held order as a whole. Each returns the order as
	// it is, and whether it was so already (replayed).
	ReserveOrder(ctx context.Context, o *stock.Order) (*stock.Order, bool, error)
	CommitOrder(ctx context.Context, id string) (*stock.Order, bool, error)
	ReleaseOrder(ctx context.Context, id, reason string) (*stock.Order, bool, error)
	GetOrder(ctx context.Context, id, key string) (*stock.Order, error)
	// AdjustStock changes available stock: a replenish, or an adjustment
	// either way (r.Kind, r.Quantity's sign).
	AdjustStock(ctx context.Context, r *stock.Request) stock.Result
	GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error)
	GetStock(ctx context.Context, sku string) (*stock.Stock, error)
}

var _ Inventory = (*allocator.Allocator)(nil)

// InventoryHandler serves the public InventoryService. Behind Admit, a
// call's caller (auth.CallerOf) gives the customer a public call counts
// against, names the caller in the ledger, and decides what GetStock
// shows.
type InventoryHandler struct {
	Inventory Inventory
	// Changes: nil where there is no change stream; WatchStock is then
	// unimplemented.
	Changes *ledger.Stream
	// WatchSendMax bounds one message of a watch served through
	// WatchWriter (0: WatchSendMaxDefault).
	WatchSendMax time.Duration
	// Log receives a line per stock-changing call at info, with its
	// caller (the allocator's startup.AuditLog); nil: none.
	Log *slog.Logger
	// Admission serves RequestToken and the ticket calls; nil: they are
	// unimplemented.
	Admission *admission.Service
}

var _ shardstockv1connect.InventoryServiceHandler = (*InventoryHandler)(nil)

// Reserve holds stock.
func (h *InventoryHandler) Reserve(ctx context.Context, req *connect.Request[v1.ReserveRequest]) (*connect.Response[v1.ReserveResponse], error) {
	m := req.Msg
	r := &stock.Request{
		Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		OrderRef: m.GetOrderRef(), CustomerRef: customerOf(ctx, m.GetCustomerRef()), TTL: wire.DurationOf(m.GetTtl()), Caller: callerOf(ctx),
	}
	res := h.Inventory.Allocate(ctx, r)
	audit(ctx, h.Log, "Reserve", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.ReserveResponse{Reservation: wire.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// Commit turns a reservation into a sale.
func (h *InventoryHandler) Commit(ctx context.Context, req *connect.Request[v1.CommitRequest]) (*connect.Response[v1.CommitResponse], error) {
	r := &stock.Request{Kind: stock.OpCommit, ReservationID: req.Msg.GetReservationId(), Quantity: req.Msg.GetQuantity(), Caller: callerOf(ctx)}
	res := h.Inventory.EndReservation(ctx, r)
	audit(ctx, h.Log, "Commit", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.CommitResponse{Reservation: wire.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// Release gives a reservation's units back.
func (h *InventoryHandler) Release(ctx context.Context, req *connect.Request[v1.ReleaseRequest]) (*connect.Response[v1.ReleaseResponse], error) {
	r := &stock.Request{Kind: stock.OpRelease, ReservationID: req.Msg.GetReservationId(), Reason: req.Msg.GetReason(), Caller: callerOf(ctx)}
	res := h.Inventory.EndReservation(ctx, r)
	audit(ctx, h.Log, "Release", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.ReleaseResponse{Reservation: wire.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// Deduct reserves and commits at once.
func (h *InventoryHandler) Deduct(ctx context.Context, req *connect.Request[v1.DeductRequest]) (*connect.Response[v1.DeductResponse], error) {
	m := req.Msg
	r := &stock.Request{
		Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		OrderRef: m.GetOrderRef(), CustomerRef: customerOf(ctx, m.GetCustomerRef()), Caller: callerOf(ctx),
	}
	res := h.Inventory.Allocate(ctx, r)
	audit(ctx, h.Log, "Deduct", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.DeductResponse{Operation: wire.OperationToProto(res.Operation), Replayed: res.Replayed}), nil
}

// Replenish returns units to available stock.
func (h *InventoryHandler) Replenish(ctx context.Context, req *connect.Request[v1.ReplenishRequest]) (*connect.Response[v1.ReplenishResponse], error) {
	m := req.Msg
	r := &stock.Request{
		Kind: stock.OpReplenish, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		OrderRef: m.GetOrderRef(), Reason: m.GetReason(), Caller: callerOf(ctx),
	}
	res := h.Inventory.AdjustStock(ctx, r)
	audit(ctx, h.Log, "Replenish", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.ReplenishResponse{Operation: wire.OperationToProto(res.Operation), Replayed: res.Replayed}), nil
}

// ExtendReservation moves a held reservation's expiry later.
func (h *InventoryHandler) ExtendReservation(ctx context.Context, req *connect.Request[v1.ExtendReservationRequest]) (*connect.Response[v1.ExtendReservationResponse], error) {
	r := &stock.Request{Kind: stock.OpExtend, ReservationID: req.Msg.GetReservationId(),
		TTL: wire.DurationOf(req.Msg.GetTtl()), Caller: callerOf(ctx)}
	res := h.Inventory.EndReservation(ctx, r)
	audit(ctx, h.Log, "ExtendReservation", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.ExtendReservationResponse{Reservation: wire.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// Refund gives back units of a sale.
func (h *InventoryHandler) Refund(ctx context.Context, req *connect.Request[v1.RefundRequest]) (*connect.Response[v1.RefundResponse], error) {
	m := req.Msg
	r := &stock.Request{
		Kind: stock.OpRefund, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		Original: wire.SaleFromProto(m.GetOriginal()), Reason: m.GetReason(), Caller: callerOf(ctx),
	}
	res := h.Inventory.Refund(ctx, r)
	audit(ctx, h.Log, "Refund", r, res)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.RefundResponse{Operation: wire.OperationToProto(res.Operation), Replayed: res.Replayed}), nil
}

// ReserveOrder holds a cart's lines all or nothing.
func (h *InventoryHandler) ReserveOrder(ctx context.Context, req *connect.Request[v1.ReserveOrderRequest]) (*connect.Response[v1.ReserveOrderResponse], error) {
	m := req.Msg
	o := &stock.Order{IdempotencyKey: m.GetIdempotencyKey(), OrderRef: m.GetOrderRef(), CustomerRef: m.GetCustomerRef(), TTL: wire.DurationOf(m.GetTtl()),
		Caller: callerOf(ctx)}
	if len(m.GetLines()) > stock.OrderLinesMax {
		// Refused before converting a hostile number of lines.
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "an order has at most %d lines", stock.OrderLinesMax))
	}
	for _, l := range m.GetLines() {
		o.Lines = append(o.Lines, stock.OrderLine{SKU: l.GetSku(), Quantity: l.GetQuantity()})
	}
	got, replayed, err := h.Inventory.ReserveOrder(ctx, o)
	auditOrder(ctx, h.Log, "ReserveOrder", got, replayed, err)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.ReserveOrderResponse{Order: wire.OrderToProto(got), Replayed: replayed}), nil
}

// CommitOrder buys every line of a held order.
func (h *InventoryHandler) CommitOrder(ctx context.Context, req *connect.Request[v1.CommitOrderRequest]) (*connect.Response[v1.CommitOrderResponse], error) {
	got, replayed, err := h.Inventory.CommitOrder(ctx, req.Msg.GetOrderId())
	auditOrder(ctx, h.Log, "CommitOrder", got, replayed, err)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.CommitOrderResponse{Order: wire.OrderToProto(got), Replayed: replayed}), nil
}

// ReleaseOrder gives every line of a held order back.
func (h *InventoryHandler) ReleaseOrder(ctx context.Context, req *connect.Request[v1.ReleaseOrderRequest]) (*connect.Response[v1.ReleaseOrderResponse], error) {
	got, replayed, err := h.Inventory.ReleaseOrder(ctx, req.Msg.GetOrderId(), req.Msg.GetReason())
	auditOrder(ctx, h.Log, "ReleaseOrder", got, replayed, err)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.ReleaseOrderResponse{Order: wire.OrderToProto(got), Replayed: replayed}), nil
}

// GetOrder reads an order.
func (h *InventoryHandler) GetOrder(ctx context.Context, req *connect.Request[v1.GetOrderRequest]) (*connect.Response[v1.GetOrderResponse], error) {
	got, err := h.Inventory.GetOrder(ctx, req.Msg.GetOrderId(), req.Msg.GetIdempotencyKey())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.GetOrderResponse{Order: wire.OrderToProto(got)}), nil
}

// GetOperation tells the state of a key.
func (h *InventoryHandler) GetOperation(ctx context.Context, req *connect.Request[v1.GetOperationRequest]) (*connect.Response[v1.GetOperationResponse], error) {
	op, err := h.Inventory.GetOperation(ctx, req.Msg.GetSku(), req.Msg.GetIdempotencyKey())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.GetOperationResponse{Operation: wire.OperationToProto(op)}), nil
}

// GetStock returns a SKU's counts.
func (h *InventoryHandler) GetStock(ctx context.Context, req *connect.Request[v1.GetStockRequest]) (*connect.Response[v1.GetStockResponse], error) {
	st, err := h.Inventory.GetStock(ctx, req.Msg.GetSku())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := StockToProto(st)
	if st.SKU != nil && st.SKU.Admission.On() && h.Admission != nil {
		// Every hold of a SKU under admission is a token.
		out.TokensOutstanding = st.Total.Reserved
		if out.WaitlistLength, err = h.Admission.Waitlist(ctx, st.SKU.Name); err != nil {
			return nil, wire.ToConnect(err)
		}
	}
	resp := &v1.GetStockResponse{Stock: out}
	if st.SKU != nil && st.SKU.Admission.Mode == stock.AdmissionDraw && h.Admission != nil {
		// A page of one ticket: the summary, not the order.
		d, err := h.Admission.GetDraw(ctx, st.SKU.Name, 0, 1)
		if err != nil {
			return nil, wire.ToConnect(err)
		}
		resp.Draw = drawSummary(d)
	}
	if internalsHidden(ctx) {
		hideInternals(out)
	}
	return connect.NewResponse(resp), nil
}

// hideInternals leaves out of a SKU's stock what only operators and
// backends see: which server holds each shard and why one halted, the
// transfers in flight and the mover (its host, pid and address).
func hideInternals(st *v1.Stock) {
	st.Moving, st.Mover = nil, nil
	for _, s := range st.Shards {
		s.ServerId, s.HaltedReason = "", ""
	}
}

var skuStatuses = map[stock.Status]v1.SkuStatus{
	stock.StatusActive: v1.SkuStatus_SKU_STATUS_ACTIVE,
	stock.StatusPaused: v1.SkuStatus_SKU_STATUS_PAUSED,
}

// StockToProto converts a SKU's stock: its shards in service, then those
// being retired, with the transfers in flight and the mover, if any.
func StockToProto(st *stock.Stock) *v1.Stock {
	out := &v1.Stock{
		Sku: st.SKU.Name, Available: st.Total.Available, Reserved: st.Total.Reserved, Sold: st.Total.Sold,
		InTransit: st.InTransit, Status: skuStatuses[st.SKU.Status], ShardsInService: st.SKU.Shards,
		Mover: wire.MoveLeaseToProto(st.Mover),
	}
	for _, s := range st.Shards {
		state := v1.ShardState_SHARD_STATE_SERVING
		if s.Retiring {
			state = v1.ShardState_SHARD_STATE_RETIRING
		}
		out.Shards = append(out.Shards, &v1.ShardStock{Index: s.Index, ServerId: s.ServerID, Available: s.Available, Reserved: s.Reserved,
			Sold: s.Sold, HaltedReason: s.HaltReason, State: state})
	}
	for _, t := range st.Moving {
		out.Moving = append(out.Moving, wire.TransferToProto(t))
	}
	return out
}
