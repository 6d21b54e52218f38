package allocator

import (
	"context"
	"strings"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// Allocate reserves or deducts: r.Kind is OpReserve or OpDeduct, r.Shard.SKU
// names the SKU (the shard is chosen here).
func (a *Allocator) Allocate(ctx context.Context, r *stock.Request) stock.Result {
	sku, err := a.prepare(ctx, r)
	if err != nil {
		return errResult(err)
	}
	if res, ok := a.fromMemory(r, sku); ok {
		return res
	}
	// Status and limits are left to the shard, which checks them after the
	// replay lookup: a retry of a deduct that succeeded before the SKU was
	// paused gets its first result, not SKU_PAUSED.
	flight := r.Shard.SKU + "\x00" + r.Key
	a.inflight.Store(flight, struct{}{})
	defer a.inflight.Delete(flight)
	res, doubt := a.take(ctx, r, sku)
	// Held in doubt before the in-flight mark goes: GetOperation never
	// sees the key in neither while a shard may still apply it.
	if len(doubt) > 0 {
		a.doubts.hold(flight)
	} else {
		a.doubts.forget(flight)
	}
	if res.Replayed {
		a.metrics.replays.Inc()
	}
	return res
}

// prepare validates a keyed request whose shard the allocator chooses and
// returns its SKU.
func (a *Allocator) prepare(ctx context.Context, r *stock.Request) (*stock.SKU, error) {
	r.Shard.Index = 0
	if r.Source == "" {
		r.Source = stock.SourceAPI
	}
	if err := stock.ValidateRequest(r); err != nil {
		return nil, err
	}
	return a.sku(ctx, r.Shard.SKU)
}

// EndReservation commits or releases a reservation: the reservation id names its
// shard, so no lookup is needed.
func (a *Allocator) EndReservation(ctx context.Context, r *stock.Request) stock.Result {
	k, err := stock.ParseReservationID(r.ReservationID)
	if err != nil {
		return errResult(err)
	}
	r.Shard = k
	if r.Source == "" {
		r.Source = stock.SourceAPI
	}
	if err := stock.ValidateRequest(r); err != nil {
		return errResult(err)
	}
	return a.exec(ctx, r)
}

// AdjustStock changes available stock. A replenish or a positive
// adjustment adds it: any shard will do, the key's first choice first. A
// negative adjustment takes it, routed as a deduct.
func (a *Allocator) AdjustStock(ctx context.Context, r *stock.Request) stock.Result {
	sku, err := a.prepare(ctx, r)
	if err != nil {
		return errResult(err)
	}
	if r.Kind == stock.OpAdjust && r.Quantity < 0 {
		res, _ := a.take(ctx, r, sku)
		return res
	}
	if a.memory.marks != nil {
		return a.reopen(ctx, r, sku)
	}
	res, _ := a.give(ctx, r, sku)
	return res
}

// give sends a request that adds stock to the key's first choice, then to
// the next shards while they answer SHARD_UNAVAILABLE. inDoubt: a shard
// it reached answered SHARD_UNAVAILABLE and may still apply it, and no
// shard applied or replayed it since.
func (a *Allocator) give(ctx context.Context, r *stock.Request, sku *stock.SKU) (res stock.Result, inDoubt bool) {
	first := firstChoice(r.Key, sku.Shards)
	res = unavailable("no shard of %s is reachable; retry with the same key", sku.Name)
	for d := int32(0); d < sku.Shards; d++ {
		rr := *r
		rr.Shard.Index = (first + d) % sku.Shards
		var reached bool
		if res, reached = a.send(ctx, &rr); res.Err == nil {
			return res, false
		}
		inDoubt = inDoubt || reached && res.Err.Code == stock.CodeShardUnavailable
		if res.Err.Code != stock.CodeShardUnavailable {
			return res, inDoubt
		}
	}
	return res, inDoubt
}

// GetOperation returns the recorded operation of a key.
func (a *Allocator) GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if err := stock.ValidateKey(key); err != nil {
		return nil, err
	}
	op, err := a.db.GetOperation(ctx, sku, key)
	if stock.CodeOf(err) == stock.CodeOperationNotFound && a.busy(sku, key) {
		return nil, stock.Errorf(stock.CodeOperationInProgress, "the operation with key %q is in progress; ask again", key)
	}
	if err == nil && stock.IsOrderLineKey(op.IdempotencyKey) && op.ReservationID != "" && a.orders != nil {
		// A line's key is a hash of its order and SKU, so the order is
		// found by the line's reservation in the orders' database.
		if op.OrderID, err = a.orders.OrderOfLine(ctx, op.ReservationID); err != nil {
			a.log.Warn("GetOperation: the order of a line", "sku", sku, "err", err)
			return nil, stock.Errorf(stock.CodeShardUnavailable, "the orders' database did not answer; ask again")
		}
	}
	return op, err
}

// LookupOperations reads the operations of a SKU's keys, by key, in one
// round trip; busy holds the keys found in none that a request of this
// process may still apply (in flight, or in doubt), as GetOperation
// answers OPERATION_IN_PROGRESS for them.
func (a *Allocator) LookupOperations(ctx context.Context, sku string, keys []string) (ops map[string]*stock.Operation, busy map[string]bool, err error) {
	if ops, err = a.db.LookupOperations(ctx, sku, keys); err != nil {
		return nil, nil, err
	}
	for _, key := range keys {
		if ops[key] == nil && a.busy(sku, key) {
			if busy == nil {
				busy = map[string]bool{}
			}
			busy[key] = true
		}
	}
	return ops, busy, nil
}

// busy reports whether a request of this process with sku's key may
// still be applied: in flight, or held in doubt. A key found in neither
// it, nor the database, was never applied.
func (a *Allocator) busy(sku, key string) bool {
	flight := sku + "\x00" + key
	_, ok := a.inflight.Load(flight)
	return ok || a.doubts.holds(flight)
}

// GetStock reads a SKU's counts as committed.
func (a *Allocator) GetStock(ctx context.Context, name string) (*stock.Stock, error) {
	if err := stock.ValidateSKU(name); err != nil {
		return nil, err
	}
	sku, err := a.readSKU(ctx, name)
	if err != nil {
		return nil, err
	}
	read, err := a.admin.StockRead(ctx, name, movingListed)
	if err != nil {
		return nil, err
	}
	view := a.topo()
	st := &stock.Stock{SKU: sku, InTransit: read.InTransit, Total: read.Totals, Moving: read.Moving}
	for _, r := range read.Shards {
		srv, _, _ := view.Owner(stock.PartitionOf(name, r.Index))
		st.Shards = append(st.Shards, stock.ShardStock{Index: r.Index, ServerID: srv.ID, Counts: r.Counts, HaltReason: r.HaltReason, Retiring: r.Retiring})
	}
	if leases, err := a.MoveLeases(ctx); err == nil {
		for _, l := range leases {
			if l.SKU == name {
				st.Mover = &l
			}
		}
	}
	return st, nil
}

// movingListed bounds the transfers in flight GetStock lists.
const movingListed = 100

// CreateSKU creates a SKU with initial stock spread over its shards.
func (a *Allocator) CreateSKU(ctx context.Context, s stock.SKU, initial int64) (*stock.Stock, error) {
	if err := stock.PrepareNewSKU(&s, initial); err != nil {
		return nil, err
	}
	if err := a.admin.CreateSKU(ctx, s, initial); err != nil {
		return nil, err
	}
	return a.GetStock(ctx, s.Name)
}

// UpdateSKU pauses or resumes a SKU or changes its limits.
func (a *Allocator) UpdateSKU(ctx context.Context, name string, u stock.SKUUpdate) (*stock.SKU, error) {
	if err := stock.ValidateSKU(name); err != nil {
		return nil, err
	}
	var mpo, cl int64
	if u.MaxPerOrder != nil {
		mpo = *u.MaxPerOrder
	}
	if u.CustomerLimit != nil {
		cl = *u.CustomerLimit
	}
	if err := stock.ValidateLimits(mpo, cl); err != nil {
		return nil, err
	}
	if u.MaxHold != nil {
		if err := stock.ValidateMaxHold(*u.MaxHold, stock.ReservationTTLMin); err != nil {
			return nil, err
		}
	}
	if u.Admission != nil {
		// The token TTL defaults to the SKU's reservation TTL as it is now.
		ttl := stock.ReservationTTLDefault
		if u.Admission.TokenTTL == 0 {
			cur, err := a.db.GetSKU(ctx, name)
			if err != nil {
				return nil, err
			}
			ttl = cur.ReservationTTL
		}
		if err := stock.ValidateAdmission(u.Admission, ttl); err != nil {
			return nil, err
		}
	}
	defer a.forgetSKU(name)
	return a.admin.UpdateSKU(ctx, name, u)
}

// Topology returns the current view of servers and owners.
func (a *Allocator) Topology() topology.View { return a.topo() }

// ListLedger pages through a SKU's ledger.
func (a *Allocator) ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if _, err := a.admin.GetSKU(ctx, sku); err != nil {
		return nil, err
	}
	return a.admin.ListLedger(ctx, sku, after, limit)
}

// ListTransfers pages through transfers.
func (a *Allocator) ListTransfers(ctx context.Context, f stock.TransferFilter, after string, limit int) ([]*stock.Transfer, error) {
	if f.SKU != "" {
		if err := stock.ValidateSKU(f.SKU); err != nil {
			return nil, err
		}
	}
	return a.admin.ListTransfers(ctx, f, after, limit)
}

// Reconcile checks a SKU's books.
func (a *Allocator) Reconcile(ctx context.Context, sku string) ([]ledger.Discrepancy, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	snap, err := a.admin.Snapshot(ctx, sku)
	if err != nil {
		return nil, err
	}
	ds := ledger.Check(snap)
	result := "balanced"
	if len(ds) > 0 {
		result = "unbalanced"
	}
	a.metrics.reconciles.WithLabelValues(result).Inc()
	return ds, nil
}

// errResult answers a request that failed with err: the database failing
// is a reason to retry.
func errResult(err error) stock.Result {
	return stock.ErrResult(err, stock.Errorf(stock.CodeShardUnavailable, "database unavailable; retry with the same key"))
}

// ResumeShard lets a halted shard take writes again, its row taken as it
// is, after a person (approver) has looked, and returns why it had halted.
// Its owner reads the row again within a second of it.
func (a *Allocator) ResumeShard(ctx context.Context, k stock.ShardKey, approver, reason string) (string, error) {
	if err := stock.ValidateSKU(k.SKU); err != nil {
		return "", err
	}
	if k.Index < 0 || k.Index >= stock.ShardsMax {
		return "", stock.Errorf(stock.CodeInvalidArgument, "index must be between 0 and %d, got %d", stock.ShardsMax-1, k.Index)
	}
	if strings.TrimSpace(approver) == "" || strings.TrimSpace(reason) == "" {
		return "", stock.Errorf(stock.CodeInvalidArgument, "resuming a shard needs a reason and an approver")
	}
	if err := stock.ValidateText("approver", approver, stock.ApproverLenMax); err != nil {
		return "", err
	}
	if err := stock.ValidateText("reason", reason, stock.ReasonLenMax); err != nil {
		return "", err
	}
	was, err := a.admin.ResumeShard(ctx, k)
	if err != nil {
		return "", err
	}
	a.log.Warn("halted shard resumed by an operator", "shard", k.String(), "approver", approver, "reason", reason, "halted_reason", was)
	return was, nil
}
