package api

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/stock"
)

// Policy says the least role each procedure needs: the public role may
// read a SKU's stock (without internals) and make the calls the
// deployment opted in; the service role makes every InventoryService call;
// the admin role every AdminService call (and, with it, what a service
// may).
type Policy struct {
	public map[string]bool // procedures
}

// publicReads are the calls open to the public role in every deployment:
// a SKU's stock, read or watched, without internals.
var publicReads = map[string]bool{
	shardstockv1connect.InventoryServiceGetStockProcedure:   true,
	shardstockv1connect.InventoryServiceWatchStockProcedure: true,
}

// publicAdmission are the admission calls, open to the public role in
// every deployment (they are what a browser makes during a drop), each
// with whether it needs a verified customer: RequestToken counts the
// customer's tokens, CancelTicket must be the ticket's customer's; a
// ticket is read by its id, 128 random bits, or by its key, only by its
// customer (InventoryHandler.GetTicket).
var publicAdmission = map[string]bool{
	shardstockv1connect.InventoryServiceRequestTokenProcedure: true,
	shardstockv1connect.InventoryServiceCancelTicketProcedure: true,
	shardstockv1connect.InventoryServiceGetTicketProcedure:    false,
	shardstockv1connect.InventoryServiceWatchTicketProcedure:  false,
	// A draw is public: anyone may replay it.
	shardstockv1connect.InventoryServiceGetDrawProcedure: false,
}

// PublicOptIns are the InventoryService calls a deployment may open to the
// public role (-public-calls). Replenish is not among them: it creates
// stock.
var PublicOptIns = []string{"Reserve", "Commit", "Release", "Deduct", "GetOperation"}

// NewPolicy returns the policy that opens the calls named in publicCalls
// (method names of PublicOptIns) to the public role.
func NewPolicy(publicCalls []string) (*Policy, error) {
	p := &Policy{public: map[string]bool{}}
	for proc := range publicReads {
		p.public[proc] = true
	}
	for proc := range publicAdmission {
		p.public[proc] = true
	}
	for _, name := range publicCalls {
		ok := false
		for _, allowed := range PublicOptIns {
			ok = ok || name == allowed
		}
		if !ok {
			return nil, fmt.Errorf("a public call must be one of %s, not %q", strings.Join(PublicOptIns, ", "), name)
		}
		p.public["/"+shardstockv1connect.InventoryServiceName+"/"+name] = true
	}
	return p, nil
}

// Need is the least role procedure needs: public for those the policy
// opens, service for the other InventoryService calls, admin for the
// rest. A public caller of an opened call other than a read must be a
// verified customer (customer): per-customer limits count it, and a
// caller without one would escape them.
func (p *Policy) Need(procedure string) (role auth.Role, customer bool) {
	switch {
	case p.public[procedure]:
		if customer, ok := publicAdmission[procedure]; ok {
			return auth.RolePublic, customer
		}
		return auth.RolePublic, !publicReads[procedure]
	case strings.HasPrefix(procedure, "/"+shardstockv1connect.InventoryServiceName+"/"):
		return auth.RoleService, false
	default:
		return auth.RoleAdmin, false
	}
}

// customerOf is the customer a call counts against: the request's
// customer_ref when a service (which vouches for it) calls, the verified
// customer of the credential when the public role calls (nobody without
// one), never a field a browser sets.
func customerOf(ctx context.Context, ref string) string {
	if c, ok := auth.CallerFrom(ctx); ok && c.Role == auth.RolePublic {
		return c.Customer
	}
	return ref
}

// callerOf names the caller for the ledger: empty for a call that went
// through no authentication.
func callerOf(ctx context.Context) string {
	if c, ok := auth.CallerFrom(ctx); ok {
		return c.String()
	}
	return ""
}

// internalsHidden says whether a call's answer must leave out the
// internals (servers, halts, transfers, the mover): a public caller's.
func internalsHidden(ctx context.Context) bool {
	c, ok := auth.CallerFrom(ctx)
	return ok && c.Role == auth.RolePublic
}

// audit logs a stock-changing call at info with its caller (role and
// credential id, never the secret) and its outcome; the caller is in its
// ledger entries too (stock.Request.Caller). log is the process's audit
// log, which hands the line to a writer of its own (startup.AuditLog): a
// write a line would cost each call of the hot path a system call. The
// record has no program counter (slog.NewRecord with pc 0): no handler of
// shardstock writes the source, and LogAttrs walks the stack for it
// (runtime.Callers) on every call.
func audit(ctx context.Context, log *slog.Logger, call string, r *stock.Request, res stock.Result) {
	if log == nil || !log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "stock call", 0)
	rec.AddAttrs(slog.String("call", call), slog.String("caller", r.Caller),
		slog.String("sku", r.Shard.SKU), slog.String("key", r.Key), slog.String("reservation", r.ReservationID),
		slog.Int64("quantity", r.Quantity), slog.String("outcome", outcomeOf(res.Err, res.Replayed)))
	_ = log.Handler().Handle(ctx, rec)
}

// auditOrder logs an order call as audit does a stock call: the order's
// lines are held and ended by the allocator (source order) and their
// ledger entries name the caller who placed the order, so the log is
// where the caller of each later call (CommitOrder, ReleaseOrder) is named.
func auditOrder(ctx context.Context, log *slog.Logger, call string, o *stock.Order, replayed bool, err error) {
	if log == nil || !log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	outcome := outcomeOf(nil, replayed)
	if err != nil {
		outcome = string(stock.CodeOf(err))
	}
	attrs := []slog.Attr{slog.String("call", call), slog.String("caller", callerOf(ctx)), slog.String("outcome", outcome)}
	if o != nil {
		attrs = append(attrs, slog.String("order", o.ID), slog.String("order_ref", o.OrderRef), slog.Int("lines", len(o.Lines)))
	}
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "order call", 0)
	rec.AddAttrs(attrs...)
	_ = log.Handler().Handle(ctx, rec)
}

// outcomeOf is an audit line's outcome: the refusal's code, replayed, or ok.
func outcomeOf(err *stock.Error, replayed bool) string {
	switch {
	case err != nil:
		return string(err.Code)
	case replayed:
		return "replayed"
	}
	return "ok"
}
