package baseline

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/stock"
)

// naiveTake is the source document's 误区一, as written there: read the stock,
// decide in the client, then update without a condition, each statement on
// its own (no transaction, no idempotency record). Between the read and the
// update other clients read the same stock, so the row can go negative; a
// repeated key is applied again.
func (p *Postgres) naiveTake(ctx context.Context, kind stock.OpKind, sku, key string, qty int64) (string, loadgen.Outcome) {
	var available int64
	err := p.pool.QueryRow(ctx, p.q.naiveSelect, sku).Scan(&available)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", loadgen.Error(string(stock.CodeSKUNotFound))
	}
	if err != nil {
		return "", outcomeOf(ctx, err)
	}
	if available < qty {
		return "", loadgen.OutOfStock
	}
	update, dR, dS := p.q.naiveDeduct, int64(0), qty
	if kind == stock.OpReserve {
		update, dR, dS = p.q.naiveReserve, qty, 0
	}
	if _, err := p.pool.Exec(ctx, update, sku, qty); err != nil {
		return "", outcomeOf(ctx, err)
	}
	var resID *string
	if kind == stock.OpReserve {
		id := newReservationID(sku)
		resID = &id
		if _, err := p.pool.Exec(ctx, p.q.insertReservation, id, sku, 0, qty, key); err != nil {
			return "", outcomeOf(ctx, err)
		}
	}
	if _, err := p.pool.Exec(ctx, p.q.insertLedger, sku, 0, string(kind), qty, key, resID, -qty, dR, dS); err != nil {
		return "", outcomeOf(ctx, err)
	}
	if resID != nil {
		return *resID, loadgen.OK
	}
	return "", loadgen.OK
}

// naiveEnd commits or releases the same way: read the reservation's state,
// then change it, the row and the ledger in separate statements. Two
// concurrent commits of one reservation can both pass the read.
func (p *Postgres) naiveEnd(ctx context.Context, kind stock.OpKind, id string) loadgen.Outcome {
	state, move := stock.ReservationCommitted, p.q.commitStock
	if kind == stock.OpRelease {
		state, move = stock.ReservationReleased, p.q.releaseStock
	}
	var sku, key, cur string
	var idx int32
	var qty int64
	err := p.pool.QueryRow(ctx, p.q.selectReservation, id).Scan(&sku, &idx, &qty, &key, &cur)
	if errors.Is(err, pgx.ErrNoRows) {
		return loadgen.Error(string(stock.CodeReservationNotFound))
	}
	if err != nil {
		return outcomeOf(ctx, err)
	}
	if stock.ReservationState(cur) != stock.ReservationHeld {
		// The naive design has no replays: a repeated commit is an error.
		if o := endedOutcome(state, stock.ReservationState(cur)); o.Status != loadgen.StatusReplayed {
			return o
		}
		if state == stock.ReservationCommitted {
			return loadgen.Error(string(stock.CodeReservationAlreadyCommitted))
		}
		return loadgen.Error(string(stock.CodeReservationAlreadyReleased))
	}
	if _, err := p.pool.Exec(ctx, p.q.reservationState, id, string(state)); err != nil {
		return outcomeOf(ctx, err)
	}
	if _, err := p.pool.Exec(ctx, move, sku, idx, qty); err != nil {
		return outcomeOf(ctx, err)
	}
	dA, dS := int64(0), qty
	if kind == stock.OpRelease {
		dA, dS = qty, 0
	}
	if _, err := p.pool.Exec(ctx, p.q.insertLedger, sku, idx, string(kind), qty, key, id, dA, -qty, dS); err != nil {
		return outcomeOf(ctx, err)
	}
	return loadgen.OK
}
