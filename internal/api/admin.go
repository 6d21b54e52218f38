package api

import (
	"context"
	"encoding/base64"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/wire"
)

// Page sizes of the admin listings.
const (
	pageSizeDefault = 100
	pageSizeMax     = 1000
)

// Admin is what the AdminService serves: the allocator, or the load
// generator's in-memory ceiling.
type Admin interface {
	Inventory
	CreateSKU(ctx context.Context, s stock.SKU, initial int64) (*stock.Stock, error)
	UpdateSKU(ctx context.Context, name string, u stock.SKUUpdate) (*stock.SKU, error)
	// ListLedger returns up to limit entries of a SKU with ids above after.
	ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error)
	// ListTransfers returns up to limit transfers that f selects with ids
	// above after.
	ListTransfers(ctx context.Context, f stock.TransferFilter, after string, limit int) ([]*stock.Transfer, error)
	// SetShards changes the number of a SKU's shards in service and returns
	// its stock once the new layout is in force.
	SetShards(ctx context.Context, sku string, shards int32) (*stock.Stock, error)
	// Rebalance runs one plan for a SKU now and returns its transfers; with
	// dryRun, the plan's moves (state planned), moving nothing.
	Rebalance(ctx context.Context, sku string, dryRun bool) ([]*stock.Transfer, error)
	// MoveLeases lists the rebalance leases held now.
	MoveLeases(ctx context.Context) ([]stock.MoveLease, error)
	Topology() topology.View
	Reconcile(ctx context.Context, sku string) ([]ledger.Discrepancy, error)
	// ResumeShard clears a shard's halt and returns why it had halted.
	ResumeShard(ctx context.Context, k stock.ShardKey, approver, reason string) (string, error)
}

var _ Admin = (*allocator.Allocator)(nil)

// Placement is the placement of SKUs on databases (internal/dbset.Set):
// GetTopology shows it and SetPlacement publishes a new version.
type Placement interface {
	Placement() stock.Placement
	// Configured reports whether this process has a URL for database name.
	Configured(name string) bool
	SetPlacement(ctx context.Context, databases []string) (stock.Placement, error)
}

// AdminHandler serves the AdminService.
type AdminHandler struct {
	Admin Admin
	// Placement: nil where SKUs are not placed (the in-memory ceiling);
	// SetPlacement is then unimplemented.
	Placement Placement
	// Changes: nil where there is no change stream; WatchLedger is then
	// unimplemented.
	Changes *ledger.Stream
	// WatchSendMax bounds one message of a watch served through
	// WatchWriter (0: WatchSendMaxDefault).
	WatchSendMax time.Duration
	// Catalog lists SKUs; nil: ListSkus is unimplemented.
	Catalog Catalog
	// Warmer prewarms SKUs; nil: Prewarm is unimplemented.
	Warmer Warmer
	// Metrics are the process's metrics ReadMetrics reads; nil:
	// ReadMetrics is unimplemented.
	Metrics prometheus.Gatherer
	// SKUCalls, if set, are the per-SKU call figures ReadMetrics reads for
	// the SKUs it is asked for (internal/transport's SKUCalls).
	SKUCalls interface {
		Families(skus []string) []*dto.MetricFamily
	}
}

var _ shardstockv1connect.AdminServiceHandler = (*AdminHandler)(nil)

// AuditAdmin returns an interceptor that logs every AdminService call with
// its caller (role and credential id, never the secret) and its outcome:
// at info those that may change something, at debug the reads (no side
// effects: the dashboard polls them every second); AdjustStock's caller is
// in its ledger entry too.
func AuditAdmin(log *slog.Logger) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			level := slog.LevelInfo
			if req.Spec().IdempotencyLevel == connect.IdempotencyNoSideEffects {
				level = slog.LevelDebug
			}
			outcome := "ok"
			if err != nil {
				outcome = connect.CodeOf(err).String()
			}
			log.LogAttrs(ctx, level, "admin call", slog.String("call", req.Spec().Procedure),
				slog.String("caller", callerOf(ctx)), slog.String("outcome", outcome))
			return resp, err
		}
	}
}

// CreateSku creates a SKU.
func (h *AdminHandler) CreateSku(ctx context.Context, req *connect.Request[v1.CreateSkuRequest]) (*connect.Response[v1.CreateSkuResponse], error) {
	m := req.Msg
	if err := validTimes(m.GetSaleStart(), m.GetSaleEnd(), m.GetAdmission().GetDrawAt()); err != nil {
		return nil, wire.ToConnect(err)
	}
	st, err := h.Admin.CreateSKU(ctx, stock.SKU{
		Name: m.GetSku(), Shards: m.GetShards(), MaxPerOrder: m.GetMaxPerOrder(), CustomerLimit: m.GetCustomerLimit(),
		ReservationTTL: wire.DurationOf(m.GetReservationTtl()), SaleStart: timeOf(m.GetSaleStart()), SaleEnd: timeOf(m.GetSaleEnd()),
		MaxHold: wire.DurationOf(m.GetMaxHold()), OnePerOrder: m.GetOnePerOrder(), Admission: admissionOf(m.GetAdmission()),
	}, m.GetInitialStock())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.CreateSkuResponse{Sku: skuToProto(st.SKU), Stock: StockToProto(st)}), nil
}

// UpdateSku pauses, resumes or changes limits.
func (h *AdminHandler) UpdateSku(ctx context.Context, req *connect.Request[v1.UpdateSkuRequest]) (*connect.Response[v1.UpdateSkuResponse], error) {
	m := req.Msg
	if err := validTimes(m.GetSaleStart(), m.GetSaleEnd(), m.GetAdmission().GetDrawAt()); err != nil {
		return nil, wire.ToConnect(err)
	}
	if m.GetClearSaleWindow() && (m.SaleStart != nil || m.SaleEnd != nil) {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "clear_sale_window with sale_start or sale_end: set one or the other"))
	}
	u := stock.SKUUpdate{Paused: m.Paused, MaxPerOrder: m.MaxPerOrder, CustomerLimit: m.CustomerLimit, AutoShards: m.AutoShards,
		SaleStart: timeOrNil(m.GetSaleStart()), SaleEnd: timeOrNil(m.GetSaleEnd()), ClearSaleWindow: m.GetClearSaleWindow(),
		OnePerOrder: m.OnePerOrder}
	if m.MaxHold != nil {
		hold := wire.DurationOf(m.MaxHold)
		u.MaxHold = &hold
	}
	if m.Admission != nil {
		ad := admissionOf(m.Admission)
		u.Admission = &ad
	}
	s, err := h.Admin.UpdateSKU(ctx, m.GetSku(), u)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.UpdateSkuResponse{Sku: skuToProto(s)}), nil
}

// AdjustStock adds or removes available stock, ledgered with its reason
// and approver.
func (h *AdminHandler) AdjustStock(ctx context.Context, req *connect.Request[v1.AdjustStockRequest]) (*connect.Response[v1.AdjustStockResponse], error) {
	m := req.Msg
	if strings.TrimSpace(m.GetReason()) == "" || strings.TrimSpace(m.GetApprover()) == "" {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "an adjustment needs a reason and an approver"))
	}
	r := &stock.Request{
		Kind: stock.OpAdjust, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetDelta(), Key: m.GetIdempotencyKey(),
		Reason: m.GetReason(), Approver: m.GetApprover(), Source: stock.SourceAdminPrefix + m.GetApprover(), Caller: callerOf(ctx),
	}
	res := h.Admin.AdjustStock(ctx, r)
	if res.Err != nil {
		return nil, wire.ToConnect(res.Err)
	}
	out := &v1.AdjustStockResponse{Operation: wire.OperationToProto(res.Operation), Replayed: res.Replayed}
	if st, err := h.Admin.GetStock(ctx, m.GetSku()); err == nil {
		out.Stock = StockToProto(st)
	}
	return connect.NewResponse(out), nil
}

// SetShards changes a SKU's number of shards in service. The count is
// checked here, as CreateSku checks it, so that a bad one reaches nothing.
func (h *AdminHandler) SetShards(ctx context.Context, req *connect.Request[v1.SetShardsRequest]) (*connect.Response[v1.SetShardsResponse], error) {
	m := req.Msg
	if err := stock.ValidateSKU(m.GetSku()); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := stock.ValidateShards(m.GetShards()); err != nil {
		return nil, wire.ToConnect(err)
	}
	st, err := h.Admin.SetShards(ctx, m.GetSku(), m.GetShards())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.SetShardsResponse{Sku: skuToProto(st.SKU), Stock: StockToProto(st)}), nil
}

// Rebalance moves a SKU's leftover stock between its shards now, or with
// dry_run returns the plan.
func (h *AdminHandler) Rebalance(ctx context.Context, req *connect.Request[v1.RebalanceRequest]) (*connect.Response[v1.RebalanceResponse], error) {
	ts, err := h.Admin.Rebalance(ctx, req.Msg.GetSku(), req.Msg.GetDryRun())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.RebalanceResponse{}
	for _, t := range ts {
		out.Transfers = append(out.Transfers, wire.TransferToProto(t))
	}
	return connect.NewResponse(out), nil
}

// ListTransfers pages through transfers, of one SKU or all, in one state or
// all.
func (h *AdminHandler) ListTransfers(ctx context.Context, req *connect.Request[v1.ListTransfersRequest]) (*connect.Response[v1.ListTransfersResponse], error) {
	m := req.Msg
	f := stock.TransferFilter{SKU: m.GetSku()}
	if s := m.GetState(); s != v1.TransferState_TRANSFER_STATE_UNSPECIFIED {
		state, ok := wire.TransferStateOf(s)
		if !ok {
			return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument,
				"state %d is not a TransferState; leave it unset for every state", int32(s)))
		}
		f.State = state
	}
	after, err := decodeToken(m.GetPageToken())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	size := pageSize(m.GetPageSize())
	ts, err := h.Admin.ListTransfers(ctx, f, after, size)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.ListTransfersResponse{}
	for _, t := range ts {
		out.Transfers = append(out.Transfers, wire.TransferToProto(t))
	}
	if len(ts) == size {
		out.NextPageToken = encodeToken(ts[len(ts)-1].ID)
	}
	return connect.NewResponse(out), nil
}

// GetTopology lists servers, partition owners and the rebalance leases
// held.
func (h *AdminHandler) GetTopology(ctx context.Context, req *connect.Request[v1.GetTopologyRequest]) (*connect.Response[v1.GetTopologyResponse], error) {
	leases, err := h.Admin.MoveLeases(ctx)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	view := h.Admin.Topology()
	out := &v1.GetTopologyResponse{Partitions: int32(view.Partitions())}
	for _, l := range leases {
		out.MoveLeases = append(out.MoveLeases, wire.MoveLeaseToProto(&l))
	}
	byServer := map[string]*v1.ShardServer{}
	for _, s := range view.Servers() {
		ss := &v1.ShardServer{ServerId: s.ID, Address: s.Addr}
		byServer[s.ID] = ss
		out.Servers = append(out.Servers, ss)
	}
	for p := int32(0); p < int32(view.Partitions()); p++ {
		srv, epoch, ok := view.Owner(p)
		if !ok {
			continue
		}
		out.Owners = append(out.Owners, &v1.PartitionOwner{Partition: p, ServerId: srv.ID, Epoch: epoch})
		if ss := byServer[srv.ID]; ss != nil {
			ss.Partitions = append(ss.Partitions, p)
		}
	}
	if h.Placement != nil {
		out.Placement = h.placementToProto(h.Placement.Placement())
	}
	return connect.NewResponse(out), nil
}

func (h *AdminHandler) placementToProto(p stock.Placement) *v1.Placement {
	out := &v1.Placement{Version: p.Version(), Versions: int32(len(p.Versions))}
	slots := p.SlotCounts()
	for _, name := range p.Databases() {
		out.Databases = append(out.Databases, &v1.DatabasePlacement{Name: name, Slots: int32(slots[name]), Configured: h.Placement.Configured(name)})
	}
	return out
}

// SetPlacement publishes a new version of the placement.
func (h *AdminHandler) SetPlacement(ctx context.Context, req *connect.Request[v1.SetPlacementRequest]) (*connect.Response[v1.SetPlacementResponse], error) {
	if h.Placement == nil {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeUnimplemented, "this server places no SKUs on databases"))
	}
	p, err := h.Placement.SetPlacement(ctx, req.Msg.GetDatabases())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.SetPlacementResponse{Placement: h.placementToProto(p)}), nil
}

// ListLedger pages through a SKU's ledger.
func (h *AdminHandler) ListLedger(ctx context.Context, req *connect.Request[v1.ListLedgerRequest]) (*connect.Response[v1.ListLedgerResponse], error) {
	tok, err := decodeToken(req.Msg.GetPageToken())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	var after int64
	if tok != "" {
		if after, err = strconv.ParseInt(tok, 10, 64); err != nil || after < 0 {
			return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "page_token is not one this API gave"))
		}
	}
	size := pageSize(req.Msg.GetPageSize())
	es, err := h.Admin.ListLedger(ctx, req.Msg.GetSku(), after, size)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.ListLedgerResponse{}
	for _, e := range es {
		out.Entries = append(out.Entries, wire.LedgerEntryToProto(e))
	}
	if len(es) == size {
		out.NextPageToken = encodeToken(strconv.FormatInt(es[len(es)-1].ID, 10))
	}
	return connect.NewResponse(out), nil
}

// Reconcile checks a SKU's books.
func (h *AdminHandler) Reconcile(ctx context.Context, req *connect.Request[v1.ReconcileRequest]) (*connect.Response[v1.ReconcileResponse], error) {
	ds, err := h.Admin.Reconcile(ctx, req.Msg.GetSku())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.ReconcileResponse{Balanced: len(ds) == 0}
	for _, d := range ds {
		out.Discrepancies = append(out.Discrepancies, &v1.Discrepancy{Check: d.Check, Shard: d.Shard, Detail: d.Detail, Expected: d.Expected, Actual: d.Actual})
	}
	if st, err := h.Admin.GetStock(ctx, req.Msg.GetSku()); err == nil {
		out.Stock = StockToProto(st)
	}
	return connect.NewResponse(out), nil
}

// ResumeShard lets a halted shard take writes again.
func (h *AdminHandler) ResumeShard(ctx context.Context, req *connect.Request[v1.ResumeShardRequest]) (*connect.Response[v1.ResumeShardResponse], error) {
	m := req.Msg
	was, err := h.Admin.ResumeShard(ctx, stock.ShardKey{SKU: m.GetSku(), Index: m.GetIndex()}, m.GetApprover(), m.GetReason())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.ResumeShardResponse{HaltedReason: was}
	if st, err := h.Admin.GetStock(ctx, m.GetSku()); err == nil {
		out.Stock = StockToProto(st)
	}
	return connect.NewResponse(out), nil
}

func skuToProto(s *stock.SKU) *v1.SkuConfig {
	return &v1.SkuConfig{Sku: s.Name, Status: skuStatuses[s.Status], Shards: s.Shards, MaxPerOrder: s.MaxPerOrder,
		CustomerLimit: s.CustomerLimit, ReservationTtl: durationpb.New(s.ReservationTTL), AutoShards: s.AutoShards,
		SaleStart: protoTime(s.SaleStart), SaleEnd: protoTime(s.SaleEnd), MaxHold: durationpb.New(s.MaxHold), OnePerOrder: s.OnePerOrder,
		Admission: admissionToProto(s.Admission)}
}

func pageSize(n int32) int {
	if n <= 0 {
		return pageSizeDefault
	}
	return min(int(n), pageSizeMax)
}

// Page tokens are opaque to clients.
func encodeToken(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func decodeToken(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) > stock.TransferIDLenMax {
		return "", stock.Errorf(stock.CodeInvalidArgument, "page_token is not one this API gave")
	}
	return string(b), nil
}

var admissionModes = map[v1.AdmissionMode]stock.AdmissionMode{
	v1.AdmissionMode_ADMISSION_MODE_UNSPECIFIED: stock.AdmissionOff,
	v1.AdmissionMode_ADMISSION_MODE_TOKENS:      stock.AdmissionTokens,
	v1.AdmissionMode_ADMISSION_MODE_DRAW:        stock.AdmissionDraw,
}

// admissionOf is a SKU's admission as asked; an unknown mode is kept as
// its number so that stock.ValidateAdmission refuses it by name.
func admissionOf(m *v1.Admission) stock.Admission {
	if m == nil {
		return stock.Admission{}
	}
	mode, ok := admissionModes[m.GetMode()]
	if !ok {
		mode = stock.AdmissionMode(m.GetMode().String())
	}
	return stock.Admission{Mode: mode, TokenTTL: wire.DurationOf(m.GetTokenTtl()), WaitlistMax: m.GetWaitlistMax(),
		TokensPerCustomer: m.GetTokensPerCustomer(), DrawAt: timeOf(m.GetDrawAt())}
}

func admissionToProto(a stock.Admission) *v1.Admission {
	if !a.On() {
		return nil
	}
	out := &v1.Admission{TokenTtl: durationpb.New(a.TokenTTL), WaitlistMax: a.WaitlistMax, TokensPerCustomer: a.TokensPerCustomer,
		DrawAt: protoTime(a.DrawAt)}
	for k, v := range admissionModes {
		if v == a.Mode {
			out.Mode = k
		}
	}
	return out
}
