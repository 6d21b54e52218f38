package memory

import (
	"bytes"
	"context"
	"time"

	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/stock"
)

// Take reserves or deducts.
func (s *Server) Take(_ context.Context, r *stock.Request) stock.Result { return s.take(r) }

// End commits or releases a reservation.
func (s *Server) End(_ context.Context, r *stock.Request) stock.Result { return s.end(r) }

// Give (Replenish, AdjustStock) is not served.
func (s *Server) Give(context.Context, *stock.Request) stock.Result {
	return errResult(unimplemented("stock given back"))
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
func (s *Server) GetStock(_ context.Context, name string) (*allocator.Stock, error) {
	k, err := s.lookup(name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stock(), nil
}

// stock is k's stock; k.mu is held.
func (k *sku) stock() *allocator.Stock {
	cfg := k.cfg
	return &allocator.Stock{SKU: &cfg, Total: k.counts,
		Shards: []allocator.ShardStock{{ServerID: ServerID, Counts: k.counts}}}
}

// unimplemented is the error of the calls the server does not serve.
func unimplemented(what string) *stock.Error {
	return stock.Errorf(stock.CodeUnimplemented, "the memory target serves no %s", what)
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
