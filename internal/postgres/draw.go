package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// The draw's records (docs/admission.md, "The draw"): the registrations are
// tickets in state 'registered'; the seed is a row of admission_draws,
// written once; the drawn order is each ticket's draw_rank. Registration
// and the seed's record take the SKU's admission lock, so once the seed is
// recorded the set of tickets it draws among is fixed.

// RegisterTicket records t as a registration in sku's draw, or answers the
// ticket recorded under its key (replayed; IDEMPOTENCY_KEY_REUSED if its
// parameters differ). It refuses SALE_ENDED when the registration is
// not open (the caller's clock is past draw_at) or once the draw's seed is
// recorded, WAITLIST_FULL at registrationsMax registrations, and
// CUSTOMER_LIMIT_REACHED for a customer registered under another key.
// granted, when set, is asked once no ticket has the key: a token it
// answers (one granted directly, before the SKU sold by draw) is the
// answer, replayed, and nothing is recorded.
func (db *DB) RegisterTicket(ctx context.Context, t stock.Ticket, params []byte, registrationsMax int64, open bool,
	granted func(context.Context) (*stock.Ticket, error)) (*stock.Ticket, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if got, err := db.replayTicket(ctx, db.pool, t, params); got != nil || err != nil {
		return got, got != nil, err
	}
	if granted != nil {
		if got, err := granted(ctx); got != nil || err != nil {
			return got, got != nil, err
		}
	}
	if !open {
		return nil, false, stock.Errorf(stock.CodeSaleEnded, "the registration for the draw of sku %q has closed", t.SKU)
	}
	tx, end, err := db.beginLocked(ctx)
	if err != nil {
		return nil, false, err
	}
	defer end()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := lockAdmission(ctx, tx, t.SKU); err != nil {
		return nil, false, err
	}
	var drawn, ticketed bool
	var registered, mine int64
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM admission_draws WHERE sku = $1),
			(SELECT count(*) FROM admission_tickets WHERE sku = $1 AND state = 'registered'),
			(SELECT count(*) FROM admission_tickets WHERE sku = $1 AND customer_ref = $2 AND (state = 'registered' OR draw_rank IS NOT NULL)),
			EXISTS (SELECT 1 FROM admission_counts WHERE sku = $1)`,
		t.SKU, t.CustomerRef).Scan(&drawn, &registered, &mine, &ticketed); err != nil {
		return nil, false, err
	}
	switch {
	case drawn: // the seed is recorded: the draw's tickets are fixed
		return nil, false, stock.Errorf(stock.CodeSaleEnded, "the registration for the draw of sku %q has closed", t.SKU)
	case mine > 0:
		return nil, false, stock.Errorf(stock.CodeCustomerLimitReached, "customer %q is registered for the draw of sku %q already", t.CustomerRef, t.SKU)
	case registered >= registrationsMax:
		return nil, false, stock.Errorf(stock.CodeWaitlistFull, "the draw of sku %q holds its waitlist_max registrations", t.SKU)
	}
	// A draw grants nothing directly, but its SKU's mode may change to
	// TOKENS: its tickets are flagged like any.
	if err := db.flagTicketed(ctx, t.SKU, ticketed); err != nil {
		return nil, false, err
	}
	t.ID, t.State, t.Keyed = newTicketID(), stock.TicketRegistered, true
	return db.insertTicket(ctx, tx, t, params)
}

// SeedDraw records seed as sku's draw's seed unless one is recorded
// already, and returns the one recorded: a worker that takes over a draw
// draws with its predecessor's seed, never with its own.
func (db *DB) SeedDraw(ctx context.Context, sku string, seed []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, end, err := db.beginLocked(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := lockAdmission(ctx, tx, sku); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO admission_draws (sku, seed) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING`, sku, seed); err != nil {
		return nil, err
	}
	var got []byte
	if err := tx.QueryRow(ctx, `SELECT seed FROM admission_draws WHERE sku = $1`, sku).Scan(&got); err != nil {
		return nil, err
	}
	return got, tx.Commit(ctx)
}

// RankDraw records sku's drawn order once its seed is recorded: order
// (admission.DrawOrder) maps the seed and the registered tickets' ids to
// the drawn order, and every registered ticket becomes WAITING with its
// rank, in one transaction with the draw's drawn_at. It reports false when
// there is no seed yet; a draw ranked already is left as it is.
func (db *DB) RankDraw(ctx context.Context, sku string, order func(seed []byte, ids []string) []string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, end, err := db.beginLocked(ctx)
	if err != nil {
		return false, err
	}
	defer end()
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := lockAdmission(ctx, tx, sku); err != nil {
		return false, err
	}
	var seed []byte
	var drawnAt *time.Time
	err = tx.QueryRow(ctx, `SELECT seed, drawn_at FROM admission_draws WHERE sku = $1`, sku).Scan(&seed, &drawnAt)
	switch {
	case isNoRows(err):
		return false, nil
	case err != nil:
		return false, err
	case drawnAt != nil:
		return true, nil
	}
	rows, err := tx.Query(ctx, `SELECT ticket_id FROM admission_tickets WHERE sku = $1 AND state = 'registered'`, sku)
	if err != nil {
		return false, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, err
	}
	drawn := order(seed, ids)
	ranks := make([]int64, len(drawn))
	for i := range ranks {
		ranks[i] = int64(i) + 1
	}
	if _, err := tx.Exec(ctx, `UPDATE admission_tickets t SET state = 'waiting', draw_rank = r.rank, updated_at = now()
		FROM (SELECT unnest($2::text[]) AS id, unnest($3::bigint[]) AS rank) r
		WHERE t.sku = $1 AND t.ticket_id = r.id AND t.state = 'registered'`, sku, drawn, ranks); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE admission_draws SET drawn_at = now(), tickets = $2 WHERE sku = $1`, sku, len(drawn)); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// GetDraw reads sku's draw: its state, seed and up to limit of its tickets
// in drawn order from rank after+1.
func (db *DB) GetDraw(ctx context.Context, sku string, after int64, limit int) (*stock.Draw, error) {
	ctx, tx, done, err := db.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	d := &stock.Draw{SKU: sku, State: stock.DrawRegistering}
	var drawnAt *time.Time
	err = tx.QueryRow(ctx, `SELECT seed, drawn_at, tickets FROM admission_draws WHERE sku = $1`, sku).Scan(&d.Seed, &drawnAt, &d.Total)
	switch {
	case isNoRows(err):
		err = tx.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1 AND state = 'registered'`, sku).Scan(&d.Total)
		return d, err
	case err != nil:
		return nil, err
	case drawnAt == nil:
		// Seeded, not ranked yet: the set of tickets is closed, so the
		// seed alone fixes the order; the list follows once it is ranked.
		d.State = stock.DrawSeeded
		return d, nil
	}
	d.State, d.DrawnAt = stock.DrawDrawn, *drawnAt
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM admission_tickets WHERE sku = $1 AND draw_rank IS NOT NULL AND state = 'admitted'`, sku).Scan(&d.Winners); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT ticket_id FROM admission_tickets WHERE sku = $1 AND draw_rank > $2 ORDER BY draw_rank LIMIT $3`, sku, after, limit)
	if err != nil {
		return nil, err
	}
	d.Tickets, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return d, err
}
