// Package shardstock is the load generator's Target for shardstock itself:
// the public InventoryService and AdminService over Connect, on cleartext
// HTTP/2, exactly as any client would call them.
package shardstock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	shardstockv1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/stock"
)

// Limits of the target.
const (
	AddrDefault       = "http://127.0.0.1:8080"
	setupParallelMax  = 8 // CreateSku calls in flight
	verifyParallelMax = 8 // SKUs verified at once
	ledgerPageSize    = 1000
	ledgerPagesMax    = 100_000
	dialTimeout       = 5 * time.Second
	idleConnTimeout   = 2 * time.Minute
	idleConnsMax      = 64
)

// Config configures the target.
type Config struct {
	Addr       string // the allocator's base URL; default AddrDefault
	AdminToken string // bearer token of the admin role: the AdminService
	// ServiceToken is the bearer token of the service role, which the
	// InventoryService is called with, as the services it stands for call
	// it. Empty: AdminToken (an admin acts as a service), but the allocator
	// then logs every stock call at info, an admin's (internal/api, audit):
	// a write a request that no service's call costs.
	ServiceToken string
	// HTTPClient, when set, replaces the cleartext HTTP/2 client.
	HTTPClient *http.Client
	// Prewarm: once its SKUs are created, Setup starts their shard writers
	// (AdminService.Prewarm), as an operator does before a sale
	// (docs/operations.md); false: each shard's first request reads its row.
	Prewarm bool
}

// Target drives a running shardstock allocator.
type Target struct {
	cfg   Config
	http  *http.Client
	inv   shardstockv1connect.InventoryServiceClient
	admin shardstockv1connect.AdminServiceClient
}

var _ loadgen.OrderTarget = (*Target)(nil)

// New returns a target for the allocator at cfg.Addr.
func New(cfg Config) *Target {
	if cfg.Addr == "" {
		cfg.Addr = AddrDefault
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = newHTTP2Client()
	}
	service := cfg.ServiceToken
	if service == "" {
		service = cfg.AdminToken
	}
	return &Target{
		cfg:   cfg,
		http:  hc,
		inv:   shardstockv1connect.NewInventoryServiceClient(hc, cfg.Addr, connect.WithInterceptors(bearer(service))),
		admin: shardstockv1connect.NewAdminServiceClient(hc, cfg.Addr, connect.WithInterceptors(bearer(cfg.AdminToken))),
	}
}

// bearer sends token in every request's Authorization header.
func bearer(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}
}

// newHTTP2Client speaks cleartext HTTP/2 with prior knowledge, like the
// Connect and gRPC clients between shardstock's own services.
func newHTTP2Client() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols:           &p,
		MaxIdleConnsPerHost: idleConnsMax,
		IdleConnTimeout:     idleConnTimeout,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
	}}
}

// Name is "shardstock".
func (t *Target) Name() string { return "shardstock" }

// Setup creates every SKU with its stock and shards (AdminService.CreateSku).
// SKU names are unique per run, so a shardstock that keeps its data between
// runs needs no clean-up.
func (t *Target) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(setupParallelMax)
	for _, s := range skus {
		g.Go(func() error {
			_, err := t.admin.CreateSku(gctx, connect.NewRequest(&shardstockv1.CreateSkuRequest{
				Sku: s.SKU, InitialStock: s.Stock, Shards: s.Shards,
			}))
			if err != nil {
				return fmt.Errorf("shardstock: CreateSku %s: %w", s.SKU, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil || !t.cfg.Prewarm {
		return err
	}
	return t.prewarm(ctx, skus)
}

// prewarm starts the shard writers of every SKU, api.PrewarmSKUsMax a call,
// and fails unless every shard of each is warm: a run said to be prewarmed
// must not measure cold shards.
func (t *Target) prewarm(ctx context.Context, skus []loadgen.SKUSpec) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(setupParallelMax)
	for i := 0; i < len(skus); i += api.PrewarmSKUsMax {
		chunk := skus[i:min(i+api.PrewarmSKUsMax, len(skus))]
		names := make([]string, 0, len(chunk))
		for _, s := range chunk {
			names = append(names, s.SKU)
		}
		g.Go(func() error {
			resp, err := t.admin.Prewarm(ctx, connect.NewRequest(&shardstockv1.PrewarmRequest{Skus: names}))
			if err != nil {
				return fmt.Errorf("shardstock: Prewarm %s..%s: %w", names[0], names[len(names)-1], err)
			}
			warm := make(map[string]int32, len(chunk))
			for _, w := range resp.Msg.GetSkus() {
				warm[w.GetSku()] = w.GetShardsWarm()
			}
			for _, s := range chunk {
				if warm[s.SKU] < s.Shards {
					return fmt.Errorf("shardstock: Prewarm warmed %d of the %d shards of %s", warm[s.SKU], s.Shards, s.SKU)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// withSent installs the runner's Sent hook on the HTTP request when the
// runner means to abandon it: cancel right after the request is written.
func withSent(ctx context.Context) context.Context {
	if !loadgen.Abandoning(ctx) {
		return ctx
	}
	abandoned := ctx
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { loadgen.Sent(abandoned) },
	})
}

// Deduct sends InventoryService.Deduct.
func (t *Target) Deduct(ctx context.Context, sku, key string, qty int64) loadgen.Outcome {
	resp, err := t.inv.Deduct(withSent(ctx), connect.NewRequest(&shardstockv1.DeductRequest{
		Sku: sku, Quantity: qty, IdempotencyKey: key,
	}))
	if err != nil {
		return outcomeOf(ctx, err)
	}
	return replayed(resp.Msg.GetReplayed())
}

// Reserve sends InventoryService.Reserve.
func (t *Target) Reserve(ctx context.Context, sku, key string, qty int64) (string, loadgen.Outcome) {
	resp, err := t.inv.Reserve(withSent(ctx), connect.NewRequest(&shardstockv1.ReserveRequest{
		Sku: sku, Quantity: qty, IdempotencyKey: key,
	}))
	if err != nil {
		return "", outcomeOf(ctx, err)
	}
	return resp.Msg.GetReservation().GetReservationId(), replayed(resp.Msg.GetReplayed())
}

// Commit sends InventoryService.Commit.
func (t *Target) Commit(ctx context.Context, id string) loadgen.Outcome {
	resp, err := t.inv.Commit(withSent(ctx), connect.NewRequest(&shardstockv1.CommitRequest{ReservationId: id}))
	if err != nil {
		return outcomeOf(ctx, err)
	}
	return replayed(resp.Msg.GetReplayed())
}

// Release sends InventoryService.Release.
func (t *Target) Release(ctx context.Context, id string) loadgen.Outcome {
	resp, err := t.inv.Release(withSent(ctx), connect.NewRequest(&shardstockv1.ReleaseRequest{ReservationId: id, Reason: "loadgen"}))
	if err != nil {
		return outcomeOf(ctx, err)
	}
	return replayed(resp.Msg.GetReplayed())
}

// ReserveOrder sends InventoryService.ReserveOrder, with the SKUs' default
// hold.
func (t *Target) ReserveOrder(ctx context.Context, key string, lines []loadgen.Line) (loadgen.Order, loadgen.Outcome) {
	req := &shardstockv1.ReserveOrderRequest{IdempotencyKey: key, OrderRef: key}
	for _, l := range lines {
		req.Lines = append(req.Lines, &shardstockv1.OrderLine{Sku: l.SKU, Quantity: l.Qty})
	}
	resp, err := t.inv.ReserveOrder(withSent(ctx), connect.NewRequest(req))
	if err != nil {
		return loadgen.Order{}, outcomeOf(ctx, err)
	}
	return orderOf(resp.Msg.GetOrder()), replayed(resp.Msg.GetReplayed())
}

// CommitOrder sends InventoryService.CommitOrder.
func (t *Target) CommitOrder(ctx context.Context, id string) loadgen.Outcome {
	resp, err := t.inv.CommitOrder(withSent(ctx), connect.NewRequest(&shardstockv1.CommitOrderRequest{OrderId: id}))
	if err != nil {
		return outcomeOf(ctx, err)
	}
	return replayed(resp.Msg.GetReplayed())
}

// Refund sends InventoryService.Refund of units of a committed
// reservation.
func (t *Target) Refund(ctx context.Context, sku, key, reservationID string, qty int64) loadgen.Outcome {
	resp, err := t.inv.Refund(withSent(ctx), connect.NewRequest(&shardstockv1.RefundRequest{
		Sku: sku, IdempotencyKey: key, Quantity: qty, Reason: "loadgen: payment failed",
		Original: &shardstockv1.Sale{Sale: &shardstockv1.Sale_ReservationId{ReservationId: reservationID}},
	}))
	if err != nil {
		return outcomeOf(ctx, err)
	}
	return replayed(resp.Msg.GetReplayed())
}

// GetOrder sends InventoryService.GetOrder by idempotency key;
// ORDER_NOT_FOUND is no order.
func (t *Target) GetOrder(ctx context.Context, key string) (loadgen.Order, bool, error) {
	resp, err := t.inv.GetOrder(ctx, connect.NewRequest(&shardstockv1.GetOrderRequest{IdempotencyKey: key}))
	if ce := (*connect.Error)(nil); errors.As(err, &ce) && reason(ce) == string(stock.CodeOrderNotFound) {
		return loadgen.Order{}, false, nil
	}
	if err != nil {
		return loadgen.Order{}, false, err
	}
	return orderOf(resp.Msg.GetOrder()), true, nil
}

// orderOf converts an order; the states an order passes through are one,
// loadgen.OrderOpen.
func orderOf(o *shardstockv1.Order) loadgen.Order {
	out := loadgen.Order{ID: o.GetOrderId(), State: loadgen.OrderOpen}
	switch o.GetState() {
	case shardstockv1.OrderState_ORDER_STATE_HELD:
		out.State = loadgen.OrderHeld
	case shardstockv1.OrderState_ORDER_STATE_COMMITTED:
		out.State = loadgen.OrderCommitted
	case shardstockv1.OrderState_ORDER_STATE_FAILED:
		out.State = loadgen.OrderFailed
	case shardstockv1.OrderState_ORDER_STATE_RELEASED:
		out.State = loadgen.OrderReleased
	}
	for _, l := range o.GetLines() {
		out.Lines = append(out.Lines, loadgen.Line{SKU: l.GetSku(), Qty: l.GetQuantity(), ReservationID: l.GetReservationId()})
	}
	return out
}

func replayed(r bool) loadgen.Outcome {
	if r {
		return loadgen.Replayed
	}
	return loadgen.OK
}

// outcomeOf classifies a failed call: the context's end; else the
// ErrorInfo reason (OUT_OF_STOCK is a refusal for stock, not an error);
// else the Connect code, upper-cased (UNAVAILABLE, INTERNAL, ...).
func outcomeOf(ctx context.Context, err error) loadgen.Outcome {
	if o, ok := loadgen.ErrorFromContext(ctx); ok {
		return o
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return loadgen.Error(loadgen.CodeUnavailable)
	}
	if r := reason(ce); r != "" {
		if r == string(stock.CodeOutOfStock) {
			return loadgen.OutOfStock
		}
		return loadgen.Outcome{Status: loadgen.StatusError, Code: r, Detail: ce.Message()}
	}
	return loadgen.Outcome{Status: loadgen.StatusError, Code: strings.ToUpper(ce.Code().String()), Detail: ce.Message()}
}

// reason returns the google.rpc.ErrorInfo reason of a Connect error, or "".
func reason(ce *connect.Error) string {
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// Verify asks AdminService.Reconcile for each SKU's counts (in transit
// included) and discrepancies, and pages through its ledger
// (AdminService.ListLedger) to count entries per kind, the deduct and
// reserve entries against their distinct keys, the end entries (commit,
// release, expire) against their distinct reservations, and the net stock
// replenished or adjusted. It also checks the ledger on its own: the SKU's
// opening stock plus every entry's change must give the counts Reconcile
// returned. SKUs are verified verifyParallelMax at a time.
func (t *Target) Verify(ctx context.Context, skus []loadgen.SKUSpec) (loadgen.State, error) {
	states := make([]loadgen.SKUState, len(skus))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(verifyParallelMax)
	for i, spec := range skus {
		g.Go(func() error {
			s, err := t.verifySKU(ctx, spec)
			states[i] = s
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return loadgen.State{}, err
	}
	st := loadgen.State{SKUs: make(map[string]loadgen.SKUState, len(skus))}
	for i, spec := range skus {
		st.SKUs[spec.SKU] = states[i]
	}
	return st, nil
}

// Checks that Verify itself adds to the discrepancies Reconcile lists.
const (
	checkLedgerSum = "loadgen_ledger_sum" // opening stock + ledger changes against the counts
	checkLedgerKey = "loadgen_ledger_key" // an entry without the key or reservation id it needs
)

func (t *Target) verifySKU(ctx context.Context, spec loadgen.SKUSpec) (loadgen.SKUState, error) {
	sku := spec.SKU
	rec, err := t.admin.Reconcile(ctx, connect.NewRequest(&shardstockv1.ReconcileRequest{Sku: sku}))
	if err != nil {
		return loadgen.SKUState{}, fmt.Errorf("shardstock: Reconcile %s: %w", sku, err)
	}
	stk := rec.Msg.GetStock()
	if stk == nil {
		return loadgen.SKUState{}, fmt.Errorf("shardstock: Reconcile %s: no stock in the answer", sku)
	}
	s := loadgen.SKUState{
		Available: stk.GetAvailable(),
		Reserved:  stk.GetReserved(),
		Sold:      stk.GetSold(),
		InTransit: stk.GetInTransit(),
		Ledger:    map[string]int64{},
		// The per-operation records come from the same ledger pages: each
		// deduct or reserve entry names its key (a reserve also its
		// reservation), each end entry its reservation. A batch's entries
		// commit with its operation rows, so a lost commit loses both.
		Keys:         map[string]loadgen.KeyRecord{},
		Reservations: map[string]loadgen.ReservationRecord{},
		Refunded:     map[string]int64{},
	}
	for _, d := range rec.Msg.GetDiscrepancies() {
		s.Discrepancies = append(s.Discrepancies, loadgen.Discrepancy{
			Check: d.GetCheck(), Shard: d.GetShard(), Detail: d.GetDetail(), Expected: d.GetExpected(), Actual: d.GetActual(),
		})
	}
	if !rec.Msg.GetBalanced() && len(s.Discrepancies) == 0 {
		s.Discrepancies = append(s.Discrepancies, loadgen.Discrepancy{Check: "reconcile", Shard: -1, Detail: "not balanced, no discrepancy listed"})
	}

	// shardstock places each deduct or reserve on one shard: one entry per
	// key, wherever it landed. Two entries of one key, on one shard or on
	// two, are two applications; so are two end entries of one reservation.
	keys := map[string]struct{}{}
	ends := map[string]struct{}{}
	var endEntries, missing int64
	var sum stock.Counts
	token := ""
	for page := 0; ; page++ {
		if page == ledgerPagesMax {
			return loadgen.SKUState{}, fmt.Errorf("shardstock: ListLedger %s: more than %d pages", sku, ledgerPagesMax)
		}
		resp, err := t.admin.ListLedger(ctx, connect.NewRequest(&shardstockv1.ListLedgerRequest{
			Sku: sku, PageToken: token, PageSize: ledgerPageSize,
		}))
		if err != nil {
			return loadgen.SKUState{}, fmt.Errorf("shardstock: ListLedger %s: %w", sku, err)
		}
		for _, e := range resp.Msg.GetEntries() {
			kind := e.GetKind()
			s.Ledger[kind]++
			sum.Available += e.GetAvailableAfter() - e.GetAvailableBefore()
			sum.Reserved += e.GetReservedAfter() - e.GetReservedBefore()
			sum.Sold += e.GetSoldAfter() - e.GetSoldBefore()
			switch stock.OpKind(kind) {
			case stock.OpDeduct, stock.OpReserve:
				if e.GetIdempotencyKey() == "" {
					missing++
					continue
				}
				s.Operations++
				keys[e.GetIdempotencyKey()] = struct{}{}
				k := s.Keys[e.GetIdempotencyKey()]
				k.Kind = kind
				k.Applied++
				if stock.OpKind(kind) == stock.OpReserve {
					k.ReservationID = e.GetReservationId()
					r := s.Reservations[k.ReservationID]
					s.Reservations[k.ReservationID] = r // held until an end entry says otherwise
				}
				s.Keys[e.GetIdempotencyKey()] = k
			case stock.OpCommit, stock.OpRelease, stock.OpExpire:
				if e.GetReservationId() == "" {
					missing++
					continue
				}
				endEntries++
				ends[e.GetReservationId()] = struct{}{}
				r := s.Reservations[e.GetReservationId()]
				switch stock.OpKind(kind) {
				case stock.OpCommit:
					r.Committed++
				case stock.OpRelease:
					r.Released++
				default:
					r.Expired++
				}
				s.Reservations[e.GetReservationId()] = r
			case stock.OpReplenish, stock.OpAdjust:
				s.Replenished += e.GetAvailableAfter() - e.GetAvailableBefore()
			case stock.OpRefund:
				// Sold back to available: the units it took from the sale.
				s.Refunded[e.GetOriginal()] += e.GetSoldBefore() - e.GetSoldAfter()
			}
		}
		next := resp.Msg.GetNextPageToken()
		if next == "" {
			break
		}
		if next == token {
			return loadgen.SKUState{}, fmt.Errorf("shardstock: ListLedger %s: the next page token repeats the last one", sku)
		}
		token = next
	}
	s.DistinctKeys = int64(len(keys))
	s.ExtraEnds = endEntries - int64(len(ends))

	if missing > 0 {
		s.Discrepancies = append(s.Discrepancies, loadgen.Discrepancy{Check: checkLedgerKey, Shard: -1,
			Detail: "ledger entries without the idempotency key or reservation id their kind needs", Actual: missing})
	}
	// Transfers move stock between shards: an entry that left a shard and
	// has not landed is in transit, counted apart from available.
	for _, c := range []struct {
		what      string
		want, got int64
	}{
		{"available", spec.Stock + sum.Available, s.Available},
		{"reserved", sum.Reserved, s.Reserved},
		{"sold", sum.Sold, s.Sold},
	} {
		if c.want != c.got {
			s.Discrepancies = append(s.Discrepancies, loadgen.Discrepancy{Check: checkLedgerSum, Shard: -1,
				Detail: c.what + ": opening stock + ListLedger changes against Reconcile's count", Expected: c.want, Actual: c.got})
		}
	}
	return s, nil
}

// Close closes idle connections. The SKUs stay: shardstock has no delete.
func (t *Target) Close() error {
	t.http.CloseIdleConnections()
	return nil
}

// Clients are the target's Connect clients, the InventoryService's with the
// service token and the AdminService's with the admin token: for a model
// that calls what the Target interface does not (the drop's RequestToken).
func (t *Target) Clients() (shardstockv1connect.InventoryServiceClient, shardstockv1connect.AdminServiceClient) {
	return t.inv, t.admin
}
