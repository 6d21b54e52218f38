package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

const sqlOrderColumns = `id, idempotency_key, params_hash, order_ref, customer_ref, ttl_ms, state, lines, coalesce(expires_at, created_at),
	reason, fail_code, fail_sku, created_at, caller`

func scanOrder(row pgx.Row) (*stock.Order, []byte, error) {
	var o stock.Order
	var hash, lines []byte
	var ttlMS int64
	var state, code string
	err := row.Scan(&o.ID, &o.IdempotencyKey, &hash, &o.OrderRef, &o.CustomerRef, &ttlMS, &state, &lines, &o.ExpiresAt,
		&o.Reason, &code, &o.FailSKU, &o.CreatedAt, &o.Caller)
	if isNoRows(err) {
		return nil, nil, stock.Errorf(stock.CodeOrderNotFound, "no such order")
	}
	if err != nil {
		return nil, nil, err
	}
	o.TTL, o.State, o.FailCode = time.Duration(ttlMS)*time.Millisecond, stock.OrderState(state), stock.Code(code)
	if err := json.Unmarshal(lines, &o.Lines); err != nil {
		return nil, nil, err
	}
	return &o, hash, nil
}

// CreateOrder records a new order, pending and driven by driver for
// lease, before any line is held. If its key has an order already, that
// one is returned (created false), or IDEMPOTENCY_KEY_REUSED when its
// parameters differ.
func (db *DB) CreateOrder(ctx context.Context, o *stock.Order, driver string, lease time.Duration) (*stock.Order, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	lines, err := json.Marshal(o.Lines)
	if err != nil {
		return nil, false, err
	}
	hash := stock.OrderHash(o)
	tag, err := db.pool.Exec(ctx, `INSERT INTO orders (id, idempotency_key, params_hash, order_ref, customer_ref, ttl_ms, state, lines,
			driver, lease_until, caller)
		VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, now() + $9 * interval '1 millisecond', $10)
		ON CONFLICT (idempotency_key) DO NOTHING`,
		o.ID, o.IdempotencyKey, hash, o.OrderRef, o.CustomerRef, o.TTL.Milliseconds(), lines, driver, lease.Milliseconds(), o.Caller)
	if err != nil {
		return nil, false, err
	}
	if tag.RowsAffected() == 1 {
		return o, true, nil
	}
	got, gotHash, err := scanOrder(db.pool.QueryRow(ctx, `SELECT `+sqlOrderColumns+` FROM orders WHERE idempotency_key = $1`, o.IdempotencyKey))
	if err != nil {
		return nil, false, err
	}
	if !bytes.Equal(gotHash, hash) {
		return nil, false, stock.Errorf(stock.CodeIdempotencyKeyReused, "idempotency_key %q was used with another order", o.IdempotencyKey)
	}
	return got, false, nil
}

// GetOrder reads an order by id, or by its idempotency key when id is "".
func (db *DB) GetOrder(ctx context.Context, id, key string) (*stock.Order, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	q, arg := `SELECT `+sqlOrderColumns+` FROM orders WHERE id = $1`, id
	if id == "" {
		q, arg = `SELECT `+sqlOrderColumns+` FROM orders WHERE idempotency_key = $1`, key
	}
	o, _, err := scanOrder(db.pool.QueryRow(ctx, q, arg))
	return o, err
}

// OrderOfLine returns the id of the order one of whose recorded lines
// holds reservation id, or "" if none does (index orders_lines).
func (db *DB) OrderOfLine(ctx context.Context, reservationID string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var id string
	err := db.pool.QueryRow(ctx, `SELECT id FROM orders WHERE lines @> jsonb_build_array(jsonb_build_object('reservation_id', $1::text))`,
		reservationID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// SetOrder writes o's state, lines, expiry and reason, and renews the
// lease of driver, if the order is in state from and driver drives it; or,
// with claim, if it is held or its lease ran out (driver takes it over).
// It reports whether it wrote.
func (db *DB) SetOrder(ctx context.Context, o *stock.Order, from stock.OrderState, driver string, lease time.Duration, claim bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	lines, err := json.Marshal(o.Lines)
	if err != nil {
		return false, err
	}
	var expires *time.Time
	if !o.ExpiresAt.IsZero() {
		expires = &o.ExpiresAt
	}
	tag, err := db.pool.Exec(ctx, `UPDATE orders SET state = $3, lines = $4, expires_at = $5, reason = $6, fail_code = $7, fail_sku = $8,
			driver = $9, lease_until = now() + $10 * interval '1 millisecond', updated_at = now()
		WHERE id = $1 AND state = $2 AND (driver = $9 OR ($11 AND (state = 'held' OR lease_until < now())))`,
		o.ID, string(from), string(o.State), lines, expires, o.Reason, string(o.FailCode), o.FailSKU, driver, lease.Milliseconds(), claim)
	return err == nil && tag.RowsAffected() == 1, err
}

// ClaimOrders takes over up to limit open orders whose driver's lease ran
// out, for driver: a recovery finishes or undoes them.
func (db *DB) ClaimOrders(ctx context.Context, driver string, lease time.Duration, limit int) ([]*stock.Order, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `UPDATE orders SET driver = $1, lease_until = now() + $2 * interval '1 millisecond', updated_at = now()
		WHERE id IN (SELECT id FROM orders WHERE state IN ('pending', 'committing', 'releasing') AND lease_until < now()
			ORDER BY lease_until LIMIT $3 FOR UPDATE SKIP LOCKED)
		RETURNING `+sqlOrderColumns, driver, lease.Milliseconds(), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Order, error) {
		o, _, err := scanOrder(r)
		return o, err
	})
}
