package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
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

// sqlCounts reads a SKU's tickets queued and units in flight (pending, not
// claimed) from the counts its tickets' statements keep (admission_counts,
// migration 00021), one row however long its waitlist, and whether the SKU
// has had a ticket (it has that row, migration 00022).
const sqlCounts = `SELECT coalesce(sum(queued), 0)::bigint, coalesce(sum(in_flight), 0)::bigint, count(*) > 0 FROM admission_counts WHERE sku = $1`

// sqlTicketed records, before a SKU's first ticket, that it has had one:
// its counts row.
const sqlTicketed = `INSERT INTO admission_counts (sku) VALUES ($1) ON CONFLICT (sku) DO NOTHING`

const sqlTicketColumns = `ticket_id, seq, sku, quantity, idempotency_key, customer_ref, state, token_id, expires_at, created_at, direct, coalesce(draw_rank, 0), keyed`

func scanTicket(row pgx.Row) (*stock.Ticket, error) {
	var t stock.Ticket
	var state string
	var exp *time.Time
	if err := row.Scan(&t.ID, &t.Seq, &t.SKU, &t.Quantity, &t.IdempotencyKey, &t.CustomerRef, &state, &t.TokenID, &exp, &t.CreatedAt, &t.Direct, &t.Rank, &t.Keyed); err != nil {
		return nil, err
	}
	t.State, t.ExpiresAt = stock.TicketState(state), timeOrZero(exp)
	return &t, nil
}

// beginLocked begins a transaction that will take a SKU's admission lock
// once it has one of the pool's lockTxs places (db.go says why); end
// releases the place, after the transaction ended (defer it before the
// Rollback).
func (db *DB) beginLocked(ctx context.Context) (tx pgx.Tx, end func(), err error) {
	select {
	case db.lockTxs <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	end = func() { <-db.lockTxs }
	if tx, err = db.pool.Begin(ctx); err != nil {
		end()
		return nil, nil, err
	}
	return tx, end, nil
}

// lockAdmission serialises the entries of sku's tickets until tx ends.
func lockAdmission(ctx context.Context, tx pgx.Tx, sku string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('admission:' || $1, 0))`, sku)
	return err
}

// EnterTickets records a batch of requests for tokens of sku, in the
// batch's order, or answers the ticket already recorded under an entry's
// key (replayed; IDEMPOTENCY_KEY_REUSED if its parameters differ; a key
// twice in the batch: the later ones answer the first's outcome as a
// replay). A new ticket is PENDING (its request may reserve at once) while
// no ticket waits, else WAITING, or refused WAITLIST_FULL at waitlistMax;
// CUSTOMER_LIMIT_REACHED once the customer has perCustomer tickets
// pending, waiting, or admitted with a token whose recorded expiry has not
// passed (0: no limit): a lapsed token frees its place, and what a
// customer buys in all is the SKU's customer_limit's (docs/admission.md,
// "Per customer"). free, called only while no ticket waits, reads the
// units the SKU has available and whether it is sold out for good (then
// OUT_OF_STOCK, and nothing is recorded): a new ticket also waits when the
// requests in flight ask for them all already, so that a crowd's requests
// do not all reach the shards for the same units (the worker admits the
// waiting ones as soon as they fit).
//
// The replays and a full waitlist are answered without the SKU's lock: a
// key once recorded stays, and a waitlist seen full in a snapshot was full
// at that moment of the request. The keys are read again under the lock:
// one entered meanwhile through another allocator is a replay, not a new
// ticket refused for its own customer's limit. Under the lock, whatever the batch's
// length: the lock with the counts (one round trip), the stock read (free,
// on a connection of its own), the insert of every new ticket (one
// statement) and the commit. The error is the batch's (the database);
// each entry's refusal is its own.
//
// route, when set, is called after the read without the lock (the
// batch's keys and the tickets queued), with the entries whose key has no
// ticket (fresh): it answers in out those that take no ticket (a token
// granted directly, docs/admission.md) and returns the others, which are
// entered as before.
func (db *DB) EnterTickets(ctx context.Context, sku string, entries []stock.TicketEntry, waitlistMax, perCustomer int64,
	free func(context.Context) (int64, bool, error), route stock.EntryRoute) ([]stock.TicketEntered, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	// A key twice in the batch is entered once: the first decides.
	first := make(map[string]int, len(entries))
	var unique []stock.TicketEntry
	for _, e := range entries {
		if _, ok := first[e.Ticket.IdempotencyKey]; !ok {
			first[e.Ticket.IdempotencyKey] = len(unique)
			unique = append(unique, e)
		}
	}
	got, err := db.enterTickets(ctx, sku, unique, waitlistMax, perCustomer, free, route)
	if err != nil {
		return nil, err
	}
	out := make([]stock.TicketEntered, len(entries))
	seen := make(map[string]bool, len(unique))
	for i, e := range entries {
		j := first[e.Ticket.IdempotencyKey]
		out[i] = got[j]
		switch {
		case !seen[e.Ticket.IdempotencyKey]:
			seen[e.Ticket.IdempotencyKey] = true
		case !bytes.Equal(e.Params, unique[j].Params):
			out[i] = stock.TicketEntered{Err: stock.Errorf(stock.CodeIdempotencyKeyReused, "idempotency_key was used with other parameters")}
		case out[i].Ticket != nil:
			out[i].Replayed = true
		}
	}
	return out, nil
}

// enterTickets is EnterTickets of entries with distinct keys.
func (db *DB) enterTickets(ctx context.Context, sku string, entries []stock.TicketEntry, waitlistMax, perCustomer int64,
	free func(context.Context) (int64, bool, error), route stock.EntryRoute) ([]stock.TicketEntered, error) {
	out := make([]stock.TicketEntered, len(entries))
	all := make([]int, len(entries))
	for i := range all {
		all[i] = i
	}
	// Without the lock, one round trip: the waitlist, then the replays.
	// Each statement reads its own snapshot, in this order: a key not
	// recorded when its lookup ran was not when the counts were read, so
	// that a WAITLIST_FULL below from those counts never answers a key
	// another allocator's batch recorded meanwhile (its copy gets the
	// ticket: the lookup read first, the counts after its commit, did
	// answer so).
	b := &pgx.Batch{}
	b.Queue(sqlCounts, sku)
	queueKeys(b, sku, entries, all)
	counts := stock.EntryCounts{ReadAt: time.Now()}
	res := db.pool.SendBatch(ctx, b)
	// The units in flight: read under the lock.
	err := res.QueryRow().Scan(&counts.Queued, new(int64), &counts.Ticketed)
	var recorded map[string]keyedTicket
	if err == nil {
		recorded, err = scanKeyed(res)
	}
	queued := counts.Queued
	if err := errors.Join(err, res.Close()); err != nil {
		return nil, err
	}
	fresh, err := answerReplays(ctx, db.pool, entries, all, recorded, out)
	if err != nil || len(fresh) == 0 {
		return out, err
	}
	if route != nil {
		fresh = route(ctx, counts, entries, fresh, out)
		if err := db.ticketsOfTokens(ctx, sku, entries, out); err != nil {
			return nil, err
		}
		if len(fresh) == 0 {
			return out, nil
		}
	}
	refuse := func(err error) ([]stock.TicketEntered, error) {
		for _, i := range fresh {
			out[i].Err = err
		}
		return out, nil
	}
	if queued > 0 && queued >= waitlistMax {
		return refuse(stock.Errorf(stock.CodeWaitlistFull, "the waitlist of sku %q is full", sku))
	}
	tx, end, err := db.beginLocked(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	defer tx.Rollback(context.WithoutCancel(ctx))
	held, queued, inFlight, ticketed, recorded, err := lockAndCount(ctx, tx, sku, entries, fresh, perCustomer > 0)
	if err != nil {
		return nil, err
	}
	// A key entered through another allocator since the read above (its
	// entry took the lock first) is a replay, not a new ticket counted
	// against its own customer's limit or the waitlist.
	if fresh, err = answerReplays(ctx, tx, entries, fresh, recorded, out); err != nil || len(fresh) == 0 {
		return out, err
	}
	available := int64(math.MaxInt64)
	if queued == 0 {
		// Read after the counts, under the lock: a reserve in flight is
		// then counted in the units in flight, or has taken its units
		// from those read, or both, never neither, so that the tickets
		// decided PENDING below fit what is free. A SKU sold out for good
		// records nothing, so that once it is marked sold out no ticket
		// can start to wait (RequestToken's answer from memory relies on
		// it).
		n, gone, err := free(ctx)
		if err != nil {
			return nil, err
		}
		if gone {
			return refuse(stock.Errorf(stock.CodeOutOfStock, "sku %q is sold out", sku))
		}
		available = n
	}
	// Each new entry decided in the batch's order, as if each had taken
	// the lock in turn: the counts move with every ticket recorded.
	var tickets []stock.Ticket
	var entered []int
	for _, i := range fresh {
		t := entries[i].Ticket
		t.SKU, t.State = sku, stock.TicketPending
		switch {
		case perCustomer > 0 && t.CustomerRef != "" && held[t.CustomerRef] >= perCustomer:
			out[i].Err = stock.Errorf(stock.CodeCustomerLimitReached, "customer %q holds the sku's tokens_per_customer", t.CustomerRef)
			continue
		case queued == 0 && inFlight+t.Quantity <= available:
			inFlight += t.Quantity
		case queued >= waitlistMax:
			out[i].Err = stock.Errorf(stock.CodeWaitlistFull, "the waitlist of sku %q is full", sku)
			continue
		default:
			t.State, t.Position = stock.TicketWaiting, queued
			queued++
		}
		held[t.CustomerRef]++
		t.ID, t.Keyed = newTicketID(), true
		tickets = append(tickets, t)
		entered = append(entered, i)
	}
	if len(tickets) == 0 {
		return out, nil
	}
	if err := db.flagTicketed(ctx, sku, ticketed); err != nil {
		return nil, err
	}
	if err := db.insertTickets(ctx, tx, tickets, entries, entered, out); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// flagTicketed makes sure, under sku's admission lock, that its counts row
// (the flag that it has had a ticket) is there before a ticket is entered:
// set is whether the caller read it under the lock. Missing (the SKU's
// first ticket), it is inserted and committed on a connection of its own,
// then the call waits until every read of it from before has lapsed
// (stock.DirectTrustMax), with a margin, still holding the lock.
// Every ticket is entered under that lock, so none is entered, by any
// process, before the wait has passed: another entry reads the flag set,
// but takes the lock only once this one ends.
func (db *DB) flagTicketed(ctx context.Context, sku string, set bool) error {
	if set {
		return nil
	}
	// The flag commits on a second connection while tx holds one: with
	// a pool of one that Exec would wait for tx, until the deadline.
	if n := db.pool.Config().MaxConns; n < 2 {
		return fmt.Errorf("postgres: sku %q's first ticket needs a second connection for its flag; the pool has %d", sku, n)
	}
	if _, err := db.pool.Exec(ctx, sqlTicketed, sku); err != nil {
		return err
	}
	t := time.NewTimer(stock.DirectTrustMax + stock.DirectTrustMargin)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// keyedTicket is a ticket read by its key, with what the key was first
// used for.
type keyedTicket struct {
	t    *stock.Ticket
	hash []byte
}

// The statements an entry batch runs per key or per customer probe an
// index once per key or customer, whatever the planner thinks of the
// table: written as "idempotency_key = ANY($2)" (and "customer_ref =
// ANY($2)"), the generic plan of a table whose statistics lag its growth
// (a drop fills it from empty) read every ticket of the SKU and compared
// each with every key of the batch, 2 to 6 ms a batch at a drop's
// thousands of tickets, the largest statement of a drop
// (docs/bench-log/2026-12-05-tokcpu.md). The LIMIT keeps the planner
// from turning the lateral join back into that scan, and saying that
// customer_ref is not empty (the customer index's predicate) lets it use
// that index. TestDB_TicketReadsProbeIndexes checks both plans.
const (
	// sqlTicketsByKey reads the tickets of a SKU ($1) by keys ($2).
	sqlTicketsByKey = `SELECT t.ticket_id, t.seq, t.sku, t.quantity, t.idempotency_key, t.customer_ref, t.state, t.token_id, t.expires_at,
			t.created_at, t.direct, coalesce(t.draw_rank, 0), t.keyed, t.params_hash
		FROM unnest($2::text[]) AS k(key)
		CROSS JOIN LATERAL (SELECT * FROM admission_tickets WHERE sku = $1 AND idempotency_key = k.key LIMIT 1) AS t`
	// sqlCustomerHolds counts, for each customer of $2 with any, the
	// tickets of SKU $1 that count against its tokens_per_customer.
	sqlCustomerHolds = `SELECT c.customer_ref, h.n
		FROM (SELECT DISTINCT customer_ref FROM unnest($2::text[]) AS u(customer_ref)) AS c
		CROSS JOIN LATERAL (SELECT count(*) AS n FROM admission_tickets WHERE sku = $1 AND customer_ref = c.customer_ref AND customer_ref <> ''
			AND (state IN ('pending', 'waiting') OR state = 'admitted' AND expires_at > now())) AS h
		WHERE h.n > 0`
)

// queueKeys queues the read of the tickets of entries[idx]'s keys.
func queueKeys(b *pgx.Batch, sku string, entries []stock.TicketEntry, idx []int) {
	keys := make([]string, len(idx))
	for j, i := range idx {
		keys[j] = entries[i].Ticket.IdempotencyKey
	}
	b.Queue(sqlTicketsByKey, sku, keys)
}

// scanKeyed reads the answer of queueKeys, by key.
func scanKeyed(res pgx.BatchResults) (map[string]keyedTicket, error) {
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyedTicket, error) {
		var k keyedTicket
		var err error
		k.t, err = scanTicket(rowWithHash{r, &k.hash})
		return k, err
	})
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]keyedTicket, len(found))
	for _, k := range found {
		byKey[k.t.IdempotencyKey] = k
	}
	return byKey, nil
}

// ticketsOfTokens answers, in out, the entries route answered with a
// token found by their key (a ticketless answer) with the key's ticket
// when it has one, replayed: a ticket admitted from the waitlist reserves
// under the same key as a direct grant, and the ticket may have been
// recorded by another allocator's batch after this one read the keys
// (its reserve is later still). One read, only when route found a token.
func (db *DB) ticketsOfTokens(ctx context.Context, sku string, entries []stock.TicketEntry, out []stock.TicketEntered) error {
	var found []int
	for i, e := range out {
		if e.Ticket != nil && e.Ticket.ID == "" {
			found = append(found, i)
		}
	}
	if len(found) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	queueKeys(b, sku, entries, found)
	res := db.pool.SendBatch(ctx, b)
	recorded, err := scanKeyed(res)
	if err := errors.Join(err, res.Close()); err != nil {
		return err
	}
	_, err = answerReplays(ctx, db.pool, entries, found, recorded, out)
	return err
}

// answerReplays answers, in out, the entries of idx whose key recorded
// has (replayed, with its position; IDEMPOTENCY_KEY_REUSED if the
// parameters differ), and returns the others.
func answerReplays(ctx context.Context, q querier, entries []stock.TicketEntry, idx []int, recorded map[string]keyedTicket,
	out []stock.TicketEntered) ([]int, error) {
	var fresh []int
	var replayed []*stock.Ticket
	for _, i := range idx {
		k, ok := recorded[entries[i].Ticket.IdempotencyKey]
		switch {
		case !ok:
			fresh = append(fresh, i)
		case !bytes.Equal(k.hash, entries[i].Params):
			out[i].Err = stock.Errorf(stock.CodeIdempotencyKeyReused, "idempotency_key was used with other parameters")
		default:
			out[i] = stock.TicketEntered{Ticket: k.t, Replayed: true}
			replayed = append(replayed, k.t)
		}
	}
	return fresh, setPositions(ctx, q, replayed)
}

// lockAndCount takes sku's admission lock in tx and reads, under it, in
// one round trip: the tickets queued, the units asked for by the requests
// in flight (pending, not claimed), with perCustomer the tickets that
// count against each customer's tokens_per_customer of entries[fresh],
// and the tickets of their keys.
func lockAndCount(ctx context.Context, tx pgx.Tx, sku string, entries []stock.TicketEntry, fresh []int, perCustomer bool) (
	held map[string]int64, queued, inFlight int64, ticketed bool, recorded map[string]keyedTicket, err error) {
	var customers []string
	if perCustomer {
		for _, i := range fresh {
			if c := entries[i].Ticket.CustomerRef; c != "" {
				customers = append(customers, c)
			}
		}
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended('admission:' || $1, 0))`, sku)
	b.Queue(sqlCounts, sku)
	b.Queue(sqlCustomerHolds, sku, customers)
	queueKeys(b, sku, entries, fresh)
	res := tx.SendBatch(ctx, b)
	defer res.Close()
	if _, err := res.Exec(); err != nil {
		return nil, 0, 0, false, nil, err
	}
	if err := res.QueryRow().Scan(&queued, &inFlight, &ticketed); err != nil {
		return nil, 0, 0, false, nil, err
	}
	held = map[string]int64{}
	rows, err := res.Query()
	if err != nil {
		return nil, 0, 0, false, nil, err
	}
	var c string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&c, &n}, func() error { held[c] = n; return nil }); err != nil {
		return nil, 0, 0, false, nil, err
	}
	if recorded, err = scanKeyed(res); err != nil {
		return nil, 0, 0, false, nil, err
	}
	return held, queued, inFlight, ticketed, recorded, res.Close()
}

// insertTickets writes tickets (their ids and states set; tickets[j] is
// entries[entered[j]]) in tx, one statement in the batch's order (so their
// seq is that order), and answers them in out: each as recorded, or, when
// its key entered meanwhile through another allocator, that ticket,
// replayed.
func (db *DB) insertTickets(ctx context.Context, tx pgx.Tx, tickets []stock.Ticket, entries []stock.TicketEntry, entered []int, out []stock.TicketEntered) error {
	n := len(tickets)
	ids, qs, keys, params, customers, states := make([]string, n), make([]int64, n), make([]string, n), make([][]byte, n), make([]string, n), make([]string, n)
	for j, t := range tickets {
		ids[j], qs[j], keys[j], params[j], customers[j], states[j] = t.ID, t.Quantity, t.IdempotencyKey, entries[entered[j]].Params, t.CustomerRef, string(t.State)
	}
	rows, err := tx.Query(ctx, `INSERT INTO admission_tickets (ticket_id, sku, quantity, idempotency_key, params_hash, customer_ref, state, keyed)
		SELECT u.id, $1, u.q, u.k, u.p, u.c, u.s, true
		FROM unnest($2::text[], $3::bigint[], $4::text[], $5::bytea[], $6::text[], $7::text[]) WITH ORDINALITY AS u(id, q, k, p, c, s, n)
		ORDER BY u.n
		ON CONFLICT (sku, idempotency_key) DO NOTHING RETURNING ticket_id, seq, created_at`,
		tickets[0].SKU, ids, qs, keys, params, customers, states)
	if err != nil {
		return err
	}
	type inserted struct {
		seq     int64
		created time.Time
	}
	got := make(map[string]inserted, n)
	var id string
	var in inserted
	_, err = pgx.ForEachRow(rows, []any{&id, &in.seq, &in.created}, func() error { got[id] = in; return nil })
	if err != nil {
		return err
	}
	for j := range tickets {
		t, i := tickets[j], entered[j]
		in, ok := got[t.ID]
		if ok {
			t.Seq, t.CreatedAt = in.seq, in.created
			out[i] = stock.TicketEntered{Ticket: &t}
			continue
		}
		// Entered meanwhile under the same key: the unique index's
		// answer, though every entry reads its keys under the lock (a
		// registration of a SKU whose mode changed).
		replay, err := db.replayTicket(ctx, tx, t, entries[i].Params)
		switch {
		case replay != nil:
			out[i] = stock.TicketEntered{Ticket: replay, Replayed: true}
		case err == nil:
			return fmt.Errorf("postgres: ticket key %q conflicted and was not found", t.IdempotencyKey)
		case errors.As(err, new(*stock.Error)):
			out[i].Err = err
		default:
			return err
		}
	}
	return nil
}

// insertTicket writes t (its id and state set) in tx and commits: the
// ticket, not replayed; or, when the same key entered meanwhile through
// another allocator, that ticket, replayed.
func (db *DB) insertTicket(ctx context.Context, tx pgx.Tx, t stock.Ticket, params []byte) (*stock.Ticket, bool, error) {
	err := tx.QueryRow(ctx, `INSERT INTO admission_tickets (ticket_id, sku, quantity, idempotency_key, params_hash, customer_ref, state, keyed)
		VALUES ($1, $2, $3, $4, $5, $6, $7, true) ON CONFLICT (sku, idempotency_key) DO NOTHING RETURNING seq, created_at`,
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
		if err := tx.QueryRow(ctx, `SELECT (SELECT coalesce(sum(queued), 0)::bigint FROM admission_counts WHERE sku = $1),
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

// ClaimTickets takes WAITING tickets to admit them (PENDING, claimed), in
// one statement: from then on a worker of the SKU finishes their
// admission even when no unit is free, for their reserves may hold them
// already. It returns the ids it claimed: a ticket no longer waiting
// (cancelled) is left out.
func (db *DB) ClaimTickets(ctx context.Context, ids []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `UPDATE admission_tickets SET state = 'pending', claimed_at = now(), updated_at = now()
		WHERE ticket_id = ANY($1) AND state = 'waiting' RETURNING ticket_id`, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
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
	tx, end, err := db.beginLocked(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
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

// AdmitTickets marks each PENDING or WAITING ticket of marks ADMITTED
// with its token (a reservation taken with the ticket's key), in one
// statement, and answers each ticket as it is then (nil: no such ticket).
// Admitting a ticket admitted with the same token already is a replay; a
// ticket that ended otherwise (cancelled, sold out) is answered as it
// ended, and the caller gives the token back. No admission lock: each
// mark is one row's change from pending or waiting, which the row's lock
// serialises with a cancel, and which moves no count an entry decides on
// but the units in flight, which the token's reserve already holds.
func (db *DB) AdmitTickets(ctx context.Context, marks []stock.TicketMark) ([]*stock.Ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	n := len(marks)
	ids, tokens, exps, directs := make([]string, n), make([]string, n), make([]time.Time, n), make([]bool, n)
	for i, m := range marks {
		ids[i], tokens[i], exps[i], directs[i] = m.ID, m.TokenID, m.ExpiresAt, m.Direct
	}
	rows, err := db.pool.Query(ctx, `UPDATE admission_tickets SET state = 'admitted', token_id = u.tok, expires_at = u.exp, direct = u.dir, updated_at = now()
		FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bool[]) AS u(id, tok, exp, dir)
		WHERE ticket_id = u.id AND state IN ('pending', 'waiting')
		RETURNING `+sqlTicketColumns, ids, tokens, exps, directs)
	if err != nil {
		return nil, err
	}
	admitted, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Ticket, error) { return scanTicket(r) })
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*stock.Ticket, n)
	for _, t := range admitted {
		byID[t.ID] = t
	}
	var rest []string
	for _, id := range ids {
		if byID[id] == nil {
			rest = append(rest, id)
		}
	}
	if len(rest) > 0 {
		// Admitted before (a replay), or ended otherwise: as they are.
		rows, err := db.pool.Query(ctx, `SELECT `+sqlTicketColumns+` FROM admission_tickets WHERE ticket_id = ANY($1)`, rest)
		if err != nil {
			return nil, err
		}
		others, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Ticket, error) { return scanTicket(r) })
		if err != nil {
			return nil, err
		}
		if err := setPositions(ctx, db.pool, others); err != nil {
			return nil, err
		}
		for _, t := range others {
			byID[t.ID] = t
		}
	}
	out := make([]*stock.Ticket, n)
	for i, id := range ids {
		out[i] = byID[id]
	}
	return out, nil
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
// if it was drawn), and every PENDING one older than stale (its request's
// process died before its reserve, or after one that has ended since),
// and returns how many: the SKU was found sold out for good, so none of
// them holds a unit, and a stale pending ticket left open would keep the
// SKU from being answered from memory (TicketKeys) for good.
func (db *DB) SoldOutWaiting(ctx context.Context, sku string, stale time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tag, err := db.pool.Exec(ctx, `UPDATE admission_tickets
		SET state = CASE WHEN draw_rank IS NULL THEN 'sold_out' ELSE 'lost' END, updated_at = now()
		WHERE sku = $1 AND (`+sqlQueued+` OR (state = 'pending' AND created_at < now() - $2::interval))`, sku, stale.String())
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

// snapshot begins a read-only repeatable-read transaction, whose every
// statement reads one snapshot, bounded by queryTimeout: use the context it
// returns; done rolls the transaction back.
func (db *DB) snapshot(ctx context.Context) (context.Context, pgx.Tx, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, tx, func() {
		tx.Rollback(context.WithoutCancel(ctx))
		cancel()
	}, nil
}

// GetTickets reads tickets by id, each with its position, all in one
// snapshot, for admission's watches (docs/admission.md): one row a ticket,
// and per SKU one ordered read of the keys (arrival order, or draw ranks)
// of the tickets queued before its furthest waiting one, however many of
// its tickets are asked for; each position is then counted in memory. As
// many GetTicket calls count the tickets before each ticket, one count
// each. A ticket not found is left out.
func (db *DB) GetTickets(ctx context.Context, ids []string) ([]*stock.Ticket, error) {
	ctx, tx, done, err := db.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	rows, err := tx.Query(ctx, `SELECT `+sqlTicketColumns+` FROM admission_tickets WHERE ticket_id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	tickets, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Ticket, error) { return scanTicket(r) })
	if err != nil {
		return nil, err
	}
	if err := setPositions(ctx, tx, tickets); err != nil {
		return nil, err
	}
	return tickets, nil
}

// setPositions sets the position of every WAITING ticket of tickets
// (others have none): per SKU one ordered read of the keys (arrival order,
// or draw ranks) of its tickets queued before the furthest asked for, each
// position then counted in memory. One count a ticket (position) reads as
// many index entries for each, and a round trip. (Numbering the queued
// tickets in the server and joining the asked for instead was planned as
// a nested loop on a young table: 570 ms for 2,000 of 2,000.)
func setPositions(ctx context.Context, q querier, tickets []*stock.Ticket) error {
	type furthest struct{ seq, rank int64 }
	far := map[string]*furthest{}
	for _, t := range tickets {
		if t.State != stock.TicketWaiting {
			continue
		}
		f := far[t.SKU]
		if f == nil {
			f = &furthest{}
			far[t.SKU] = f
		}
		if t.Rank > 0 {
			f.rank = max(f.rank, t.Rank)
		} else {
			f.seq = max(f.seq, t.Seq)
		}
	}
	for sku, f := range far {
		seqs, err := queuedKeys(ctx, q, sqlQueuedSeqs, sku, f.seq)
		if err != nil {
			return err
		}
		ranks, err := queuedKeys(ctx, q, sqlQueuedRanks, sku, f.rank)
		if err != nil {
			return err
		}
		for _, t := range tickets {
			switch {
			case t.SKU != sku || t.State != stock.TicketWaiting:
			case t.Rank > 0:
				t.Position = before(ranks, t.Rank)
			default:
				t.Position = before(seqs, t.Seq)
			}
		}
	}
	return nil
}

// The keys of a SKU's queued tickets before $2, in order: what position
// counts, as a list (setPositions).
const (
	sqlQueuedSeqs  = `SELECT seq FROM admission_tickets WHERE sku = $1 AND ` + sqlQueued + ` AND seq < $2 ORDER BY seq`
	sqlQueuedRanks = `SELECT draw_rank FROM admission_tickets WHERE sku = $1 AND ` + sqlQueued + ` AND draw_rank < $2 ORDER BY draw_rank`
)

// queuedKeys reads the keys below bound (0: none, and no statement).
func queuedKeys(ctx context.Context, q querier, sql, sku string, bound int64) ([]int64, error) {
	if bound == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, sql, sku, bound)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// before counts the keys below key in sorted keys.
func before(keys []int64, key int64) int64 {
	n, _ := slices.BinarySearch(keys, key)
	return int64(n)
}

func (db *DB) readTicket(ctx context.Context, where string, args ...any) (*stock.Ticket, error) {
	ctx, tx, done, err := db.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
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
// after a draw, else of arrival) that the admission worker looks at: every
// WAITING one, every one a worker claimed, and the PENDING ones older than
// stale (their request's process may have died between its reserve and
// its answer); and, read in the same snapshot, the units asked for by
// every PENDING ticket not claimed (requests in flight: their reserves may
// not have landed yet).
func (db *DB) OpenTickets(ctx context.Context, sku string, stale time.Duration, limit int) ([]*stock.Ticket, int64, error) {
	ctx, tx, done, err := db.snapshot(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	rows, err := tx.Query(ctx, sqlOpenTickets, sku, stale.String(), limit)
	if err != nil {
		return nil, 0, err
	}
	tickets, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.Ticket, error) { return scanTicket(r) })
	if err != nil {
		return nil, 0, err
	}
	var inFlight int64
	if err := tx.QueryRow(ctx, sqlCounts, sku).Scan(new(int64), &inFlight, new(bool)); err != nil {
		return nil, 0, err
	}
	return tickets, inFlight, nil
}

// sqlOpenTickets reads the first $3 of SKU $1's tickets that its worker
// looks at (OpenTickets), in drawn order, then in order of arrival: each
// part from the index in its order, up to $3. As one ORDER BY draw_rank,
// seq it read and sorted every open ticket of the SKU at every pass
// (7.6 ms behind 20,000 waiting, ten passes a second; 0.2 ms this way).
// TestDB_TicketReadsProbeIndexes checks the plan.
const sqlOpenTickets = `SELECT ` + sqlTicketColumns + ` FROM (
		(SELECT * FROM admission_tickets WHERE sku = $1 AND draw_rank IS NOT NULL AND state IN ('pending', 'waiting')
			AND (` + sqlQueued + ` OR created_at < now() - $2::interval) ORDER BY draw_rank LIMIT $3)
		UNION ALL
		(SELECT * FROM admission_tickets WHERE sku = $1 AND draw_rank IS NULL AND state IN ('pending', 'waiting')
			AND (` + sqlQueued + ` OR created_at < now() - $2::interval) ORDER BY seq LIMIT $3)) AS t
	ORDER BY draw_rank, seq LIMIT $3`

// sqlOpenTicketSKUs lists the SKUs with open tickets ($1 at most) from
// the two partial indexes of open tickets, so that each admission worker's
// look, every PollInterval, reads the open tickets only. As one
// "state IN ('pending', 'waiting', 'registered')", which neither index's
// predicate implies, it read every ticket ever entered: 31,000 ended
// tickets cost 460 ms a look on this machine under load
// (docs/bench-log/2026-12-05-tokcpu.md). TestDB_TicketReadsProbeIndexes
// checks the plan.
const sqlOpenTicketSKUs = `SELECT sku FROM (
		SELECT sku FROM admission_tickets WHERE state IN ('pending', 'waiting')
		UNION SELECT sku FROM admission_tickets WHERE state = 'registered') AS open
	ORDER BY sku LIMIT $1`

// OpenTicketSKUs returns up to limit SKUs that have tickets WAITING,
// PENDING or REGISTERED (a draw to run).
func (db *DB) OpenTicketSKUs(ctx context.Context, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, sqlOpenTicketSKUs, limit)
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
	err := db.pool.QueryRow(ctx, sqlCounts, sku).Scan(&n, new(int64), new(bool))
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
	tx, end, err := db.beginLocked(ctx)
	if err != nil {
		return 0, false, err
	}
	defer end()
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
	err := db.pool.QueryRow(ctx, `SELECT coalesce(sum(queued), 0)::bigint FROM admission_counts`).Scan(&n)
	return n, err
}
