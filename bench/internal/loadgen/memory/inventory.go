package memory

import (
	"context"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Allocate reserves or deducts.
func (s *Server) Allocate(_ context.Context, r *stock.Request) stock.Result { return s.take(r) }

// EndReservation commits or releases a reservation.
func (s *Server) EndReservation(_ context.Context, r *stock.Request) stock.Result { return s.end(r) }

// AdjustStock (Replenish, and AdminService.AdjustStock) is not served.
func (s *Server) AdjustStock(context.Context, *stock.Request) stock.Result {
	return errResult(unimplemented("stock given back"))
}

// Refund is not served: the in-memory ceiling keeps no refunds.
func (s *Server) Refund(context.Context, *stock.Request) stock.Result {
	return errResult(unimplemented("refunds"))
}

// ReserveOrder is not served: the in-memory ceiling keeps no orders.
func (s *Server) ReserveOrder(context.Context, *stock.Order) (*stock.Order, bool, error) {
	return nil, false, unimplemented("orders")
}

// CommitOrder is not served.
func (s *Server) CommitOrder(context.Context, string) (*stock.Order, bool, error) {
	return nil, false, unimplemented("orders")
}

// ReleaseOrder is not served.
func (s *Server) ReleaseOrder(context.Context, string, string) (*stock.Order, bool, error) {
	return nil, false, unimplemented("orders")
}

// GetOrder is not served.
func (s *Server) GetOrder(context.Context, string, string) (*stock.Order, error) {
	return nil, unimplemented("orders")
}

// GetOperation returns the operation recorded for a SKU's key.
func (s *Server) GetOperation(_ context.Context, sku, key string) (*stock.Operation, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if err := stock.ValidateKey(key); err != nil {
		return nil, err
	}
	s.keysMu.Lock()
	op := s.keys[key]
	s.keysMu.Unlock()
	if op == nil || op.SKU != sku {
		return nil, stock.Errorf(stock.CodeOperationNotFound, "no operation with key %q", key)
	}
	return op, nil
}

// GetStock returns a SKU's counts: one row, shard 0.
func (s *Server) GetStock(_ context.Context, name string) (*stock.Stock, error) {
	k, err := s.lookup(name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stock(), nil
}

// stock is k's stock; k.mu is held.
func (k *sku) stock() *stock.Stock {
	cfg := k.cfg
	return &stock.Stock{SKU: &cfg, Total: k.counts,
		Shards: []stock.ShardStock{{ServerID: serverID, Counts: k.counts}}}
}

// unimplemented is the error of the calls the server does not serve.
func unimplemented(what string) *stock.Error {
	return stock.Errorf(stock.CodeUnimplemented, "the memory target serves no %s", what)
}

// take decides a reserve or deduct.
func (s *Server) take(r *stock.Request) stock.Result {
	r.Source = stock.SourceAPI
	if err := stock.ValidateRequest(r); err != nil {
		return errResult(err)
	}
	k, err := s.lookup(r.Shard.SKU)
	if err != nil {
		return errResult(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// keysMu is held from the key's lookup to its binding, so that the same
	// key sent to two SKUs at once is applied once.
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	read := k.read()
	if op := s.keys[r.Key]; op != nil {
		read.Ops[r.Key] = k.current(op)
	}
	return s.decide(k, r, read)
}

// end decides a commit or a release.
func (s *Server) end(r *stock.Request) stock.Result {
	key, err := stock.ParseReservationID(r.ReservationID)
	if err != nil {
		return errResult(err)
	}
	r.Shard, r.Source = key, stock.SourceAPI
	if err := stock.ValidateRequest(r); err != nil {
		return errResult(err)
	}
	k, err := s.lookup(key.SKU)
	if err != nil {
		return errResult(stock.Errorf(stock.CodeReservationNotFound, "no reservation %q", r.ReservationID))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	read := k.read()
	if res := k.reservations[r.ReservationID]; res != nil {
		read.Reservations[res.ID] = res
	}
	return s.decide(k, r, read)
}

// read is what shardstock's batch transaction would read of k for one
// request, without the request's own lookups; k.mu is held.
func (k *sku) read() *stock.BatchRead {
	cfg := k.cfg
	return &stock.BatchRead{SKU: &cfg, Ops: map[string]*stock.Operation{}, Reservations: map[string]*stock.Reservation{},
		Usage: k.usage, Now: time.Now()}
}

// current is op with its reservation's state as it is now, as shardstock's
// lookup joins it; k.mu is held (op is k's, or of another SKU, which the
// planner refuses as a reused key).
func (k *sku) current(op *stock.Operation) *stock.Operation {
	c := *op
	if res := k.reservations[op.ReservationID]; res != nil && op.SKU == k.cfg.Name {
		c.ReservationState, c.ReservationExpiresAt = res.State, res.ExpiresAt
	}
	return &c
}

// decide runs shardstock's own planner (stock.EvaluateBatch) over k's counts for r,
// then applies what it decided to write: the ledger entries, the counts,
// the operation that binds the key, the reservations and the customer
// usage. k.mu is held, and keysMu for a keyed request.
func (s *Server) decide(k *sku, r *stock.Request, read *stock.BatchRead) stock.Result {
	if k.halted {
		return errResult(stock.Errorf(stock.CodeInternal, "sku %q is halted after an invariant violation", k.cfg.Name))
	}
	w, results, err := stock.EvaluateBatch(stock.ShardKey{SKU: k.cfg.Name}, k.counts, []*stock.Request{r}, read, false)
	if err != nil {
		k.halted = true
		return errResult(stock.Errorf(stock.CodeInternal, "%v", err))
	}
	if err := s.record(k, w.Ledger); err != nil {
		return errResult(err)
	}
	for _, op := range w.Ops {
		s.keys[op.IdempotencyKey] = op
		k.opKeys = append(k.opKeys, op.IdempotencyKey)
	}
	for _, res := range w.NewReservations {
		k.reservations[res.ID] = copyReservation(res)
	}
	for _, e := range w.Ended {
		k.reservations[e.ID].State = e.State
	}
	for c, q := range w.UsageAdd {
		k.usage[c] += q
	}
	for c, q := range w.UsageSub {
		k.usage[c] = max(k.usage[c]-q, 0)
	}
	res := results[0]
	res.Reservation = copyReservation(res.Reservation)
	return res
}

func errResult(err error) stock.Result {
	return stock.ErrResult(err, stock.Errorf(stock.CodeInternal, "internal error"))
}

// copyReservation copies r (nil: nil), so that an answer is converted
// without the SKU's lock.
func copyReservation(r *stock.Reservation) *stock.Reservation {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}
