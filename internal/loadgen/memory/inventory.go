package memory

import (
	"bytes"
	"context"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/rpc"
	"github.com/shardstock/shardstock/internal/stock"
)

// Deduct reserves and commits at once.
func (s *Server) Deduct(_ context.Context, req *connect.Request[v1.DeductRequest]) (*connect.Response[v1.DeductResponse], error) {
	m := req.Msg
	res := s.take(&stock.Request{
		Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		OrderRef: m.GetOrderRef(), CustomerRef: m.GetCustomerRef(),
	})
	if res.Err != nil {
		return nil, rpc.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.DeductResponse{Operation: rpc.OperationToProto(res.Operation), Replayed: res.Replayed}), nil
}

// Reserve holds stock.
func (s *Server) Reserve(_ context.Context, req *connect.Request[v1.ReserveRequest]) (*connect.Response[v1.ReserveResponse], error) {
	m := req.Msg
	res := s.take(&stock.Request{
		Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: m.GetSku()}, Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		OrderRef: m.GetOrderRef(), CustomerRef: m.GetCustomerRef(), TTL: rpc.DurationOf(m.GetTtl()),
	})
	if res.Err != nil {
		return nil, rpc.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.ReserveResponse{Reservation: rpc.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// Commit turns a reservation into a sale.
func (s *Server) Commit(_ context.Context, req *connect.Request[v1.CommitRequest]) (*connect.Response[v1.CommitResponse], error) {
	res := s.end(&stock.Request{Kind: stock.OpCommit, ReservationID: req.Msg.GetReservationId()})
	if res.Err != nil {
		return nil, rpc.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.CommitResponse{Reservation: rpc.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// Release gives a reservation's units back.
func (s *Server) Release(_ context.Context, req *connect.Request[v1.ReleaseRequest]) (*connect.Response[v1.ReleaseResponse], error) {
	res := s.end(&stock.Request{Kind: stock.OpRelease, ReservationID: req.Msg.GetReservationId(), Reason: req.Msg.GetReason()})
	if res.Err != nil {
		return nil, rpc.ToConnect(res.Err)
	}
	return connect.NewResponse(&v1.ReleaseResponse{Reservation: rpc.ReservationToProto(res.Reservation), Replayed: res.Replayed}), nil
}

// GetStock returns a SKU's counts.
func (s *Server) GetStock(_ context.Context, req *connect.Request[v1.GetStockRequest]) (*connect.Response[v1.GetStockResponse], error) {
	if err := stock.ValidateSKU(req.Msg.GetSku()); err != nil {
		return nil, rpc.ToConnect(err)
	}
	k, err := s.lookup(req.Msg.GetSku())
	if err != nil {
		return nil, rpc.ToConnect(err)
	}
	k.mu.Lock()
	c := k.counts
	k.mu.Unlock()
	return connect.NewResponse(&v1.GetStockResponse{Stock: stockToProto(k.cfg.SKU, c)}), nil
}

// take decides a reserve or deduct, in shardstock's order: validation, the
// SKU, the key (a replay or IDEMPOTENCY_KEY_REUSED), the SKU's refusals,
// then stock. A refusal records nothing: the key stays free.
func (s *Server) take(r *stock.Request) stock.Result {
	r.Source = stock.SourceAPI
	if err := stock.ValidateRequest(r); err != nil {
		return errResult(err)
	}
	k, err := s.lookup(r.Shard.SKU)
	if err != nil {
		return errResult(err)
	}
	hash := stock.ParamsHash(r)

	k.mu.Lock()
	defer k.mu.Unlock()
	s.keysMu.Lock()
	defer s.keysMu.Unlock()

	if op := s.keys[r.Key]; op != nil {
		if op.SKU != r.Shard.SKU || op.Kind != r.Kind || !bytes.Equal(op.ParamsHash, hash) {
			return errResult(stock.Errorf(stock.CodeIdempotencyKeyReused, "idempotency_key %q was used with other parameters", r.Key))
		}
		// The parameters match, so op is this SKU's: k.mu guards its
		// reservation.
		res := stock.Result{Operation: op, Replayed: true}
		if op.Kind == stock.OpReserve {
			res.Reservation = copyReservation(k.reservations[op.ReservationID])
		}
		return res
	}
	if code, msg := k.cfg.Refuse(r, k.usage[r.CustomerRef]); code != "" {
		return errResult(stock.Errorf(code, "%s", msg))
	}
	if k.counts.Available < r.Quantity {
		return errResult(stock.Errorf(stock.CodeOutOfStock, "not enough available stock"))
	}

	now := time.Now()
	op := &stock.Operation{
		SKU: r.Shard.SKU, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, ParamsHash: hash,
		OrderRef: r.OrderRef, CustomerRef: r.CustomerRef, CreatedAt: now,
	}
	entry := &stock.LedgerEntry{Kind: r.Kind, Quantity: r.Quantity, IdempotencyKey: r.Key, OrderRef: r.OrderRef, Source: r.Source}
	var held *stock.Reservation
	if r.Kind == stock.OpReserve {
		ttl := r.TTL
		if ttl == 0 {
			ttl = k.cfg.ReservationTTL
		}
		held = &stock.Reservation{
			ID: stock.NewReservationID(stock.ShardKey{SKU: r.Shard.SKU}), SKU: r.Shard.SKU, Quantity: r.Quantity,
			State: stock.ReservationHeld, ExpiresAt: now.Add(ttl), OrderRef: r.OrderRef, CustomerRef: r.CustomerRef,
			IdempotencyKey: r.Key,
		}
		op.ReservationID, op.ReservationState, op.ReservationExpiresAt = held.ID, held.State, held.ExpiresAt
		entry.ReservationID = held.ID
	}
	if err := s.apply(k, entry); err != nil {
		return errResult(err)
	}
	// Only an applied operation binds the key.
	s.keys[r.Key] = op
	k.opKeys = append(k.opKeys, r.Key)
	if held != nil {
		k.reservations[held.ID] = held
	}
	if k.cfg.CustomerLimit > 0 && r.CustomerRef != "" {
		k.usage[r.CustomerRef] += r.Quantity
	}
	return stock.Result{Operation: op, Reservation: copyReservation(held)}
}

// end decides a commit or a release. A reservation ends once: the second
// of the same kind is a replay, the other kind is refused with the state
// the reservation is in.
func (s *Server) end(r *stock.Request) stock.Result {
	key, err := stock.ParseReservationID(r.ReservationID)
	if err != nil {
		return errResult(err)
	}
	r.Shard, r.Source = key, stock.SourceAPI
	if err := stock.ValidateRequest(r); err != nil {
		return errResult(err)
	}
	notFound := stock.Errorf(stock.CodeReservationNotFound, "no reservation %q", r.ReservationID)
	k, err := s.lookup(key.SKU)
	if err != nil {
		return errResult(notFound)
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	res := k.reservations[r.ReservationID]
	if res == nil {
		return errResult(notFound)
	}
	commit := r.Kind == stock.OpCommit
	switch res.State {
	case stock.ReservationHeld:
		entry := &stock.LedgerEntry{Kind: r.Kind, Quantity: res.Quantity, IdempotencyKey: res.IdempotencyKey,
			ReservationID: res.ID, OrderRef: res.OrderRef, Source: r.Source, Reason: r.Reason}
		if err := s.apply(k, entry); err != nil {
			return errResult(err)
		}
		if commit {
			res.State = stock.ReservationCommitted
		} else {
			res.State = stock.ReservationReleased
			if k.cfg.CustomerLimit > 0 && res.CustomerRef != "" {
				k.usage[res.CustomerRef] -= res.Quantity
			}
		}
		return stock.Result{Reservation: copyReservation(res)}
	case stock.ReservationCommitted:
		if !commit {
			return errResult(stock.Errorf(stock.CodeReservationAlreadyCommitted, "reservation is already committed"))
		}
	case stock.ReservationReleased:
		if commit {
			return errResult(stock.Errorf(stock.CodeReservationAlreadyReleased, "reservation was released"))
		}
	}
	return stock.Result{Reservation: copyReservation(res), Replayed: true}
}

// stockToProto is a SKU's stock: one row, shard 0.
func stockToProto(name string, c stock.Counts) *v1.Stock {
	return &v1.Stock{
		Sku: name, Available: c.Available, Reserved: c.Reserved, Sold: c.Sold, Status: v1.SkuStatus_SKU_STATUS_ACTIVE,
		Shards: []*v1.ShardStock{{ServerId: ServerID, Available: c.Available, Reserved: c.Reserved, Sold: c.Sold}},
	}
}

func errResult(err error) stock.Result {
	e, ok := err.(*stock.Error)
	if !ok {
		e = stock.Errorf(stock.CodeInternal, "internal error")
	}
	return stock.Result{Err: e}
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
