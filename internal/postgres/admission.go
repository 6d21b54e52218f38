package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// The admission store: every request for a token is a ticket row
// (admission_tickets), in order of arrival. A SKU's entries are serialised
// by a transaction-scoped advisory lock on the SKU, so that the waitlist's
// bound, the customer's limit and the rule that no request goes before a
// waiting ticket are exact across allocators; the lock is held for a few
// statements, never across a call to a shard server.

// sqlQueued selects the tickets in the waitlist: those waiting, and those
// a worker took to admit (pending again, claimed), which stay ahead of any
// newcomer.
const sqlQueued = `(state = 'waiting' OR (state = 'pending' AND claimed_at IS NOT NULL))`

const sqlTicketColumns = `ticket_id, seq, sku, quantity, idempotency_key, customer_ref, state, token_id, expires_at, created_at, direct, coalesce(draw_rank, 0)`

func scanTicket(row pgx.Row) (*stock.Ticket, error) {
	var t stock.Ticket
	var state string
	var exp *time.Time
	if err := row.Scan(&t.ID, &t.Seq, &t.SKU, &t.Quantity, &t.IdempotencyKey, &t.CustomerRef, &state, &t.TokenID, &exp, &t.CreatedAt, &t.Direct, &t.Rank); err != nil {
		return nil, err
	}
	t.State, t.ExpiresAt = stock.TicketState(state), timeOrZero(exp)
	return &t, nil
}

// lockAdmission serialises the entries of sku's tickets until tx ends.
func lockAdmission(ctx context.Context, tx pgx.Tx, sku string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('admission:' || $1, 0))`, sku)
	return err
}

// EnterTicket records a request for a token of t.SKU, or answers the one
// already recorded under its key (replayed; IDEMPOTENCY_KEY_REUSED if its
// parameters differ). A new ticket is PENDING (its request may reserve at
// once) while no ticket waits, else WAITING, or refused WAITLIST_FULL at
// waitlistMax; CUSTOMER_LIMIT_REACHED once the customer has perCustomer
// tickets pending, waiting, or admitted with a token whose recorded expiry
// has not passed (0: no limit): a lapsed token frees its place, and what a
// customer buys in all is the SKU's customer_limit's (docs/admission.md,
// "Per customer"). free, called only
// while no ticket waits, reads the units the SKU has available and whether
// it is sold out for good (then OUT_OF_STOCK, and nothing is recorded): a new
// ticket also waits when the requests in flight ask for them all already,
// so that a crowd's requests do not all reach the shards for the same
// units (the worker admits the waiting ones as soon as they fit).
//
// The replay and a full waitlist are answered without the SKU's lock: a
// key once recorded stays, and a waitlist seen full in a snapshot was full
// at that moment of the request. Under the lock, four round trips: the
// lock, the counts, the insert and the commit.
func (db *DB) EnterTicket(ctx context.Context, t stock.Ticket, params []byte, waitlistMax, perCustomer int64,
	free func(context.Context) (int64, bool, error)) (*stock.Ticket, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if got, err := db.replayTicket(ctx, db.pool, t, params); got != nil || err != nil {
		return got, got != nil, err
	}
	var queued int64
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1 AND `+sqlQueued, t.SKU).Scan(&queued); err != nil {
		return nil, false, err
	}
	if queued > 0 && queued >= waitlistMax {
		return nil, false, stock.Errorf(stock.CodeWaitlistFull, "the waitlist of sku %q is full", t.SKU)
	}
	available := int64(math.MaxInt64)
	if queued == 0 {
		n, gone, err := free(ctx)
		if err != nil {
			return nil, false, err
		}
		if gone {
			// Sold out for good when read: nothing can come back to a
			// ticket but a replenish.
			return nil, false, stock.Errorf(stock.CodeOutOfStock, "sku %q is sold out", t.SKU)
		}
		available = n
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := lockAdmission(ctx, tx, t.SKU); err != nil {
		return nil, false, err
	}
	var held, inFlight int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE `+sqlQueued+`),
			count(*) FILTER (WHERE $2 <> '' AND customer_ref = $2 AND (state IN ('pending', 'waiting') OR state = 'admitted' AND expires_at > now())),
			coalesce(sum(quantity) FILTER (WHERE state = 'pending' AND claimed_at IS NULL), 0)::bigint
		FROM admission_tickets WHERE sku = $1 AND (state IN ('pending', 'waiting') OR ($2 <> '' AND customer_ref = $2))`, t.SKU, t.CustomerRef).
		Scan(&queued, &held, &inFlight); err != nil {
		return nil, false, err
	}
	if perCustomer > 0 && held >= perCustomer {
		return nil, false, stock.Errorf(stock.CodeCustomerLimitReached, "customer %q holds the sku's tokens_per_customer", t.CustomerRef)
	}
	t.State = stock.TicketPending
	if queued == 0 && inFlight+t.Quantity > available {
		// It would wait only for the units read before the lock: read
		// them again under it. A SKU sold out for good since then records
		// nothing, so that once it is marked sold out no ticket can start
		// to wait (RequestToken's answer from memory relies on it).
		n, gone, err := free(ctx)
		if err != nil {
			return nil, false, err
		}
		if gone {
			return nil, false, stock.Errorf(stock.CodeOutOfStock, "sku %q is sold out", t.SKU)
		}
		available = n
	}
	if queued > 0 || inFlight+t.Quantity > available {
		if queued >= waitlistMax {
			return nil, false, stock.Errorf(stock.CodeWaitlistFull, "the waitlist of sku %q is full", t.SKU)
		}
		t.State, t.Position = stock.TicketWaiting, queued
	}
	t.ID = newTicketID()
	return db.insertTicket(ctx, tx, t, params)
}

// insertTicket writes t (its id and state set) in tx and commits: the
// ticket, not replayed; or, when the same key entered meanwhile through
// another allocator, that ticket, replayed.
func (db *DB) insertTicket(ctx context.Context, tx pgx.Tx, t stock.Ticket, params []byte) (*stock.Ticket, bool, error) {
	err := tx.QueryRow(ctx, `INSERT INTO admission_tickets (ticket_id, sku, quantity, idempotency_key, params_hash, customer_ref, state)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (sku, idempotency_key) DO NOTHING RETURNING seq, created_at`,
		t.ID, t.SKU, t.Quantity, t.IdempotencyKey, params, t.CustomerRef, string(t.State)).Scan(&t.Seq, &t.CreatedAt)
	if isNoRows(err) {
		got, err := db.replayTicket(ctx, tx, t, params)
		return got, got != nil, err
	}
	if err != nil {
		return nil, false, err
	}
	return &t, false, tx.Commit(ctx)
}

// replayTicket answers the ticket recorded under t's key, with its
// position; nil when there is none.
func (db *DB) replayTicket(ctx context.Context, q querier, t stock.Ticket, params []byte) (*stock.Ticket, error) {
	var hash []byte
	got, err := scanTicket(rowWithHash{q.QueryRow(ctx, `SELECT `+sqlTicketColumns+`, params_hash FROM admission_tickets
		WHERE sku = $1 AND idempotency_key = $2`, t.SKU, t.IdempotencyKey), &hash})
	switch {
	case isNoRows(err):
		return nil, nil
	case err != nil:
		return nil, err
	case !bytes.Equal(hash, params):
		return nil, stock.Errorf(stock.CodeIdempotencyKeyReused, "idempotency_key was used with other parameters")
	}
	got.Position, err = position(ctx, q, got)
	return got, err
}

// rowWithHash scans a ticket's columns, then its params_hash.
type rowWithHash struct {
	pgx.Row
	hash *[]byte
}

func (r rowWithHash) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.hash)...) }

// newTicketID returns a fresh ticket id: 128 random bits.
func newTicketID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "tkt_" + hex.EncodeToString(b[:])
}

// position counts the tickets waiting before t (0 unless t waits): in
// drawn order after a draw, else in order of arrival.
func position(ctx context.Context, q querier, t *stock.Ticket) (int64, error) {
	if t.State != stock.TicketWaiting {
		return 0, nil
	}
	var n int64
	if t.Rank > 0 {
		err := q.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1 AND `+sqlQueued+` AND draw_rank < $2`, t.SKU, t.Rank).Scan(&n)
		return n, err
	}
	err := q.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1 AND `+sqlQueued+` AND seq < $2`, t.SKU, t.Seq).Scan(&n)
	return n, err
}

// WaitTicket moves a PENDING ticket whose request found no free unit into
// the waitlist, in its place of arrival; WAITLIST_FULL (and the ticket is
// forgotten: it holds nothing) when waitlistMax tickets wait already. A
// ticket a worker took from the waitlist goes back without that bound. A
// ticket no longer pending is answered as it is.
func (db *DB) WaitTicket(ctx context.Context, id string, waitlistMax int64) (*stock.Ticket, error) {
	return db.ticketTx(ctx, id, func(ctx context.Context, tx pgx.Tx, t *stock.Ticket) error {
		if t.State != stock.TicketPending {
			return nil
		}
		var waiting int64
		var claimed bool
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM admission_tickets WHERE sku = $1 AND `+sqlQueued+`),
			(SELECT claimed_at IS NOT NULL FROM admission_tickets WHERE ticket_id = $2)`, t.SKU, id).Scan(&waiting, &claimed); err != nil {
			return err
		}
		if !claimed && waiting >= waitlistMax {
			if _, err := tx.Exec(ctx, `DELETE FROM admission_tickets WHERE ticket_id = $1`, id); err != nil {
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			return stock.Errorf(stock.CodeWaitlistFull, "the waitlist of sku %q is full", t.SKU)
		}
		t.State = stock.TicketWaiting
		_, err := tx.Exec(ctx, `UPDATE admission_tickets SET state = 'waiting', updated_at = now() WHERE ticket_id = $1`, id)
		return err
	})
}

// ClaimTicket takes a WAITING ticket to admit it (PENDING, claimed):
// from then on a worker of the SKU finishes its admission even when no
// unit is free, for its reserve may hold them already. It reports false
// when the ticket no longer waits (cancelled).
func (db *DB) ClaimTicket(ctx context.Context, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tag, err := db.pool.Exec(ctx, `UPDATE admission_tickets SET state = 'pending', claimed_at = now(), updated_at = now()
		WHERE ticket_id = $1 AND state = 'waiting'`, id)
	return tag.RowsAffected() == 1, err
}

// DropTicket forgets a PENDING ticket whose request was refused for good
// (a paused SKU, a limit): it holds nothing, and a retry of its key is
// decided afresh.
func (db *DB) DropTicket(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	_, err := db.pool.Exec(ctx, `DELETE FROM admission_tickets WHERE ticket_id = $1 AND state = 'pending'`, id)
	return err
}

// ticketTx runs f on ticket id, read under its SKU's admission lock, and
// commits unless f did; the ticket is answered as f left it, with its
// position.
func (db *DB) ticketTx(ctx context.Context, id string, f func(context.Context, pgx.Tx, *stock.Ticket) error) (*stock.Ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var sku string
	if err := tx.QueryRow(ctx, `SELECT sku FROM admission_tickets WHERE ticket_id = $1`, id).Scan(&sku); err != nil {
		if isNoRows(err) {
			return nil, stock.Errorf(stock.CodeTicketNotFound, "no ticket %q", id)
		}
		return nil, err
	}
	if err := lockAdmission(ctx, tx, sku); err != nil {
		return nil, err
	}
	t, err := scanTicket(tx.QueryRow(ctx, `SELECT `+sqlTicketColumns+` FROM admission_tickets WHERE ticket_id = $1`, id))
	if err != nil {
		return nil, err
	}
	if err := f(ctx, tx, t); err != nil {
		return nil, err
	}
	if t.Position, err = position(ctx, tx, t); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil && err != pgx.ErrTxClosed {
		return nil, err
	}
	return t, nil
}

// AdmitTicket marks a PENDING or WAITING ticket ADMITTED with its token (a
// reservation taken with the ticket's key). Admitting a ticket admitted
// with the same token already is a replay; a ticket that ended otherwise
// (cancelled, sold out) is answered as it ended, and the caller gives the
// token back.
func (db *DB) AdmitTicket(ctx context.Context, id, tokenID string, expiresAt time.Time, direct bool) (*stock.Ticket, error) {
	return db.ticketTx(ctx, id, func(ctx context.Context, tx pgx.Tx, t *stock.Ticket) error {
		if t.State != stock.TicketPending && t.State != stock.TicketWaiting {
			return nil
		}
		t.State, t.TokenID, t.ExpiresAt, t.Direct = stock.TicketAdmitted, tokenID, expiresAt, direct
		_, err := tx.Exec(ctx, `UPDATE admission_tickets SET state = 'admitted', token_id = $2, expires_at = $3, direct = $4, updated_at = now()
			WHERE ticket_id = $1`, id, tokenID, expiresAt, direct)
		return err
	})
}

// CancelTicket takes a PENDING or WAITING ticket out of the waitlist, or a
// REGISTERED one out of its draw; a ticket that ended is answered as it
// ended.
func (db *DB) CancelTicket(ctx context.Context, id string) (*stock.Ticket, error) {
	return db.ticketTx(ctx, id, func(ctx context.Context, tx pgx.Tx, t *stock.Ticket) error {
		if t.State != stock.TicketPending && t.State != stock.TicketWaiting && t.State != stock.TicketRegistered {
			return nil
		}
		t.State = stock.TicketCancelled
		_, err := tx.Exec(ctx, `UPDATE admission_tickets SET state = 'cancelled', updated_at = now() WHERE ticket_id = $1`, id)
		return err
	})
}

// SoldOutTicket marks a PENDING ticket SOLD_OUT: its request found the SKU
// sold out for good.
func (db *DB) SoldOutTicket(ctx context.Context, id string) (*stock.Ticket, error) {
	return db.ticketTx(ctx, id, func(ctx context.Context, tx pgx.Tx, t *stock.Ticket) error {
		if t.State != stock.TicketPending {
			return nil
		}
		t.State = stock.TicketSoldOut
		_, err := tx.Exec(ctx, `UPDATE admission_tickets SET state = 'sold_out', updated_at = now() WHERE ticket_id = $1`, id)
		return err
	})
}

// SoldOutWaiting marks every ticket of sku still WAITING SOLD_OUT (LOST
// if it was drawn), and returns how many: the SKU was found sold out for
// good.
func (db *DB) SoldOutWaiting(ctx context.Context, sku string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tag, err := db.pool.Exec(ctx, `UPDATE admission_tickets
		SET state = CASE WHEN draw_rank IS NULL THEN 'sold_out' ELSE 'lost' END, updated_at = now()
		WHERE sku = $1 AND `+sqlQueued, sku)
	return tag.RowsAffected(), err
}

// GetTicket reads a ticket by id, with its position.
func (db *DB) GetTicket(ctx context.Context, id string) (*stock.Ticket, error) {
	return db.readTicket(ctx, `ticket_id = $1`, id)
}

// GetTicketByKey reads a ticket by its SKU and request's key.
func (db *DB) GetTicketByKey(ctx context.Context, sku, key string) (*stock.Ticket, error) {
	return db.readTicket(ctx, `sku = $1 AND idempotency_key = $2`, sku, key)
}

func (db *DB) readTicket(ctx context.Context, where string, args ...any) (*stock.Ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	t, err := scanTicket(tx.QueryRow(ctx, `SELECT `+sqlTicketColumns+` FROM admission_tickets WHERE `+where, args...))
	if isNoRows(err) {
		return nil, stock.Errorf(stock.CodeTicketNotFound, "no such ticket")
	}
	if err != nil {
		return nil, err
	}
	t.Position, err = position(ctx, tx, t)
	return t, err
}

// OpenTickets returns up to limit of sku's tickets in order (drawn order
// after a draw, else of arrival) that the admission worker looks at: every WAITING one, every one a
// worker claimed, and the PENDING ones older than stale (their request's
// process may have died between its reserve and its answer).
func (db *DB) OpenTickets(ctx context.Context, sku string, stale time.Duration, limit int) ([]*stock.Ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT `+sqlTicketColumns+` FROM admission_tickets
		WHERE sku = $1 AND (`+sqlQueued+` OR (state = 'pending' AND created_at < now() - $2::interval))
		ORDER BY draw_rank, seq LIMIT $3`, sku, stale.String(), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Ticket, error) { return scanTicket(r) })
}

// OpenTicketSKUs returns up to limit SKUs that have tickets WAITING,
// PENDING or REGISTERED (a draw to run).
func (db *DB) OpenTicketSKUs(ctx context.Context, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT DISTINCT sku FROM admission_tickets WHERE state IN ('pending', 'waiting', 'registered') ORDER BY sku LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// WaitingCount is the number of sku's tickets in the waitlist.
func (db *DB) WaitingCount(ctx context.Context, sku string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1 AND `+sqlQueued, sku).Scan(&n)
	return n, err
}

// TicketKeys calls each with the keys of sku's tickets, at most limit, read
// under the SKU's admission lock (so after every entry that took it
// before, and before any that takes it after), and returns how many it
// found (up to limit+1) and whether a ticket was open then: pending,
// waiting or registered.
func (db *DB) TicketKeys(ctx context.Context, sku string, limit int, each func(key string)) (int, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := lockAdmission(ctx, tx, sku); err != nil {
		return 0, false, err
	}
	var open bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM admission_tickets WHERE sku = $1 AND state IN ('pending', 'waiting', 'registered'))`, sku).Scan(&open); err != nil {
		return 0, false, err
	}
	if open {
		return 0, true, nil
	}
	rows, err := tx.Query(ctx, `SELECT idempotency_key FROM admission_tickets WHERE sku = $1 LIMIT $2`, sku, limit+1)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return 0, false, err
		}
		if n++; n <= limit {
			each(k)
		}
	}
	return n, false, rows.Err()
}

// WaitingTotal is the number of tickets in every SKU's waitlist.
func (db *DB) WaitingTotal(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE `+sqlQueued).Scan(&n)
	return n, err
}
