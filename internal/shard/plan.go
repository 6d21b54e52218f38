package shard

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/shardstock/shardstock/internal/stock"
)

// plan decides a batch in memory: given the shard's counts, the batch's
// requests in arrival order and what the transaction read, it returns what to
// write and every request's result. It is pure (a rerun of the batch calls it
// again with a fresh read) and asserts that no count goes negative.
//
// Requests are decided one after another, so a batch behaves exactly like
// the same requests applied one at a time: a key seen twice in one batch is a
// replay of its first occurrence, a reservation ended earlier in the batch is
// ended for the requests after it.
func plan(shard stock.ShardKey, from stock.Counts, reqs []*stock.Request, read *stock.BatchRead, sweep bool) (*stock.BatchWrite, []stock.Result, error) {
	p := &planner{
		shard:   shard,
		read:    read,
		cur:     from,
		w:       &stock.BatchWrite{From: from},
		results: make([]stock.Result, len(reqs)),
		hashes:  make([][]byte, len(reqs)),
		seen:    map[string]int{},
		ended:   map[string]*stock.Reservation{},
		stepped: map[string]stock.TransferState{},
	}
	if read.SKU != nil {
		p.w.UsageLimit = read.SKU.CustomerLimit
	}
	for i, r := range reqs {
		switch {
		case r.Kind.Keyed():
			p.keyed(i, r)
		case r.Kind == stock.OpCommit || r.Kind == stock.OpRelease:
			p.end(i, r)
		case r.Kind == stock.OpTransferOut || r.Kind == stock.OpTransferIn:
			p.transfer(i, r)
		}
	}
	if sweep {
		for _, due := range read.Due {
			if _, done := p.ended[due.ID]; !done {
				p.expire(copyReservation(due), stock.SourceSweeper)
			}
		}
	}
	p.w.To = p.cur
	if !p.cur.Valid() {
		// plan checks stock before every move, so this is a bug: refuse the
		// batch and halt the shard rather than write a negative count (the
		// CHECK constraints would refuse it too).
		return nil, nil, fmt.Errorf("%w: plan drove %s to %+v", errInvariant, shard, p.cur)
	}
	avail := p.cur.Available
	if read.SKU != nil && shard.Index >= read.SKU.Shards {
		avail = 0 // being retired: nothing here for the allocator to route to
	}
	for i := range p.results {
		p.results[i].Available = avail
	}
	return p.w, p.results, nil
}

// Plan is plan for implementations that keep the same books elsewhere than
// in Postgres (the load generator's in-memory ceiling, internal/loadgen/
// memory): one decision procedure, so that they apply shardstock's rules
// and not a copy of them. It does not sweep due reservations. A non-nil
// error wraps errInvariant.
func Plan(shard stock.ShardKey, from stock.Counts, reqs []*stock.Request, read *stock.BatchRead) (*stock.BatchWrite, []stock.Result, error) {
	return plan(shard, from, reqs, read, false)
}

// errInvariant: a batch would break an invariant; its shard is halted.
var errInvariant = errors.New("shard: INVARIANT violated")

type planner struct {
	shard   stock.ShardKey
	read    *stock.BatchRead
	cur     stock.Counts
	w       *stock.BatchWrite
	results []stock.Result
	hashes  [][]byte
	seen    map[string]int                 // key -> first request in the batch
	ended   map[string]*stock.Reservation  // reservations ended in this batch
	stepped map[string]stock.TransferState // transfers stepped in this batch
}

func (p *planner) fail(i int, code stock.Code, format string, args ...any) {
	p.results[i] = stock.Result{Err: stock.Errorf(code, format, args...)}
}

// keyed decides a reserve, deduct, replenish or adjust.
func (p *planner) keyed(i int, r *stock.Request) {
	p.hashes[i] = stock.ParamsHash(r)
	if j, ok := p.seen[r.Key]; ok {
		if !bytes.Equal(p.hashes[j], p.hashes[i]) {
			p.fail(i, stock.CodeIdempotencyKeyReused, "idempotency_key %q was used with other parameters", r.Key)
			return
		}
		p.results[i] = p.results[j]
		p.results[i].Replayed = p.results[j].Err == nil
		return
	}
	if op := p.read.Ops[r.Key]; op != nil {
		p.replay(i, r, op)
		return
	}
	if code, msg := p.refuse(r); code != "" {
		p.fail(i, code, "%s", msg)
		return
	}
	op := &stock.Operation{
		SKU: r.Shard.SKU, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, Shard: r.Shard.Index,
		ParamsHash: p.hashes[i], OrderRef: r.OrderRef, CustomerRef: r.CustomerRef, CreatedAt: p.read.Now,
	}
	entry := &stock.LedgerEntry{Kind: r.Kind, Quantity: r.Quantity, IdempotencyKey: r.Key, OrderRef: r.OrderRef,
		Source: r.Source, Reason: r.Reason, Approver: r.Approver}
	if r.Kind == stock.OpReserve {
		ttl := r.TTL
		if ttl == 0 {
			ttl = p.read.SKU.ReservationTTL
		}
		res := &stock.Reservation{
			ID: stock.NewReservationID(p.shard), SKU: p.shard.SKU, Shard: p.shard.Index, Quantity: r.Quantity,
			State: stock.ReservationHeld, ExpiresAt: p.read.Now.Add(ttl), OrderRef: r.OrderRef,
			CustomerRef: r.CustomerRef, IdempotencyKey: r.Key,
		}
		op.ReservationID, op.ReservationState, op.ReservationExpiresAt = res.ID, res.State, res.ExpiresAt
		entry.ReservationID = res.ID
		p.w.NewReservations = append(p.w.NewReservations, res)
		p.results[i] = stock.Result{Reservation: res, Operation: op}
	} else {
		p.results[i] = stock.Result{Operation: op}
	}
	if p.limited(r) {
		if p.w.UsageAdd == nil {
			p.w.UsageAdd = map[string]int64{}
		}
		p.w.UsageAdd[r.CustomerRef] += r.Quantity
	}
	// Only a new operation binds the key for the rest of the batch: a key
	// whose first occurrence was refused is still free, as it would be if
	// the requests came one at a time.
	p.seen[r.Key] = i
	p.w.Ops = append(p.w.Ops, op)
	p.apply(entry, r.Kind, r.Quantity)
}

// refuse returns why a new keyed request cannot apply here, or "".
func (p *planner) refuse(r *stock.Request) (stock.Code, string) {
	sku := p.read.SKU
	if sku == nil {
		return stock.CodeSKUNotFound, "no sku " + quote(r.Shard.SKU)
	}
	if r.Kind != stock.OpReserve && r.Kind != stock.OpDeduct {
		if r.Kind == stock.OpAdjust && p.cur.Available+r.Quantity < 0 {
			return stock.CodeOutOfStock, "not enough available stock on this shard to remove"
		}
		// The ceiling is checked here, in memory against the running
		// counts, so that the batch never writes past it: nothing but an
		// inflow (this, or a transfer's credit) raises what a shard holds.
		if r.Quantity > 0 && r.Quantity > p.cur.Room() {
			return stock.CodeInvalidQuantity, fmt.Sprintf("%s of %d would take this shard past %d units held (available plus reserved); it holds %d",
				r.Kind, r.Quantity, int64(stock.ShardCountMax), p.cur.Available+p.cur.Reserved)
		}
		return "", ""
	}
	if code, msg := sku.Refuse(r, p.usage(r.CustomerRef)); code != "" {
		return code, msg
	}
	if p.shard.Index >= sku.Shards {
		// Out of service after SetShards: its stock is being moved away.
		// The allocator sweeps and finds it (or routes elsewhere).
		return stock.CodeOutOfStock, "this shard is being retired"
	}
	if p.cur.Available < r.Quantity {
		return stock.CodeOutOfStock, "not enough available stock"
	}
	return "", ""
}

// limited reports whether a request counts against a customer limit.
func (p *planner) limited(r *stock.Request) bool {
	return p.read.SKU != nil && p.read.SKU.CustomerLimit > 0 && r.CustomerRef != "" &&
		(r.Kind == stock.OpReserve || r.Kind == stock.OpDeduct)
}

func (p *planner) usage(customer string) int64 {
	return p.read.Usage[customer] + p.w.UsageAdd[customer] - p.w.UsageSub[customer]
}

// replay answers a key that already has an operation: its first result if
// the parameters match, IDEMPOTENCY_KEY_REUSED if not. Storage reads only
// the SKU's own operations (BatchRead.Ops); an operation of another SKU
// here would be its bug, and is refused rather than replayed.
func (p *planner) replay(i int, r *stock.Request, op *stock.Operation) {
	if op.SKU != r.Shard.SKU || op.Kind != r.Kind || !bytes.Equal(op.ParamsHash, p.hashes[i]) {
		p.fail(i, stock.CodeIdempotencyKeyReused, "idempotency_key %q was used with other parameters", r.Key)
		return
	}
	res := stock.Result{Operation: op, Replayed: true}
	if op.Kind == stock.OpReserve {
		state := op.ReservationState
		if ended := p.ended[op.ReservationID]; ended != nil {
			state = ended.State
		}
		res.Reservation = &stock.Reservation{
			ID: op.ReservationID, SKU: op.SKU, Shard: op.Shard, Quantity: op.Quantity, State: state,
			ExpiresAt: op.ReservationExpiresAt, OrderRef: op.OrderRef, CustomerRef: op.CustomerRef, IdempotencyKey: op.IdempotencyKey,
		}
	}
	p.results[i] = res
}

// end decides a commit or a release. A reservation ends exactly once: the
// first of commit, release and expiry wins, the others report it.
func (p *planner) end(i int, r *stock.Request) {
	res := p.ended[r.ReservationID]
	if res == nil {
		if got := p.read.Reservations[r.ReservationID]; got != nil {
			res = copyReservation(got)
		}
	}
	if res == nil || res.SKU != p.shard.SKU || res.Shard != p.shard.Index {
		p.fail(i, stock.CodeReservationNotFound, "no reservation %s", quote(r.ReservationID))
		return
	}
	if res.State == stock.ReservationHeld && !p.read.Now.Before(res.ExpiresAt) {
		p.expire(res, r.Source) // due but not yet swept: expire it first
	}
	commit := r.Kind == stock.OpCommit
	switch res.State {
	case stock.ReservationHeld:
		if commit {
			res.State = stock.ReservationCommitted
		} else {
			res.State = stock.ReservationReleased
			p.giveBack(res)
		}
		p.finish(res, r.Kind, r.Source, r.Reason)
		p.results[i] = stock.Result{Reservation: res}
	case stock.ReservationCommitted:
		if !commit {
			p.fail(i, stock.CodeReservationAlreadyCommitted, "reservation is already committed")
			return
		}
		p.results[i] = stock.Result{Reservation: res, Replayed: true}
	case stock.ReservationReleased:
		if commit {
			p.fail(i, stock.CodeReservationAlreadyReleased, "reservation was released")
			return
		}
		p.results[i] = stock.Result{Reservation: res, Replayed: true}
	case stock.ReservationExpired:
		if commit {
			p.fail(i, stock.CodeReservationExpired, "reservation expired")
			return
		}
		p.results[i] = stock.Result{Reservation: res, Replayed: true} // released by expiry already
	}
}

// transfer decides one step of a two-phase transfer: the source debits a
// pending transfer (or aborts it when it lacks the stock), the destination
// credits a debited one. A step already taken is a replay.
func (p *planner) transfer(i int, r *stock.Request) {
	t := p.read.Transfers[r.TransferID]
	out := r.Kind == stock.OpTransferOut
	if t == nil || t.SKU != p.shard.SKU || (out && t.From != p.shard.Index) || (!out && t.To != p.shard.Index) {
		p.fail(i, stock.CodeInvalidArgument, "no transfer %s for this shard", quote(r.TransferID))
		return
	}
	state := t.State
	if s, ok := p.stepped[t.ID]; ok {
		state = s
	}
	step := func(next stock.TransferState, kind stock.OpKind) {
		p.stepped[t.ID] = next
		p.w.Steps = append(p.w.Steps, stock.TransferStep{ID: t.ID, From: state, To: next})
		if kind != "" {
			p.apply(&stock.LedgerEntry{Kind: kind, Quantity: t.Quantity, TransferID: t.ID, Source: r.Source, Reason: t.Reason}, kind, t.Quantity)
		}
	}
	switch {
	case out && state == stock.TransferPending && t.FenceToken < p.read.MoveFences[t.SKU]:
		// A newer mover holds the SKU: this one's lease has gone, and its
		// move must not start (the step's statement checks the same).
		step(stock.TransferAborted, "")
		p.fail(i, stock.CodeMoveFenced, "a newer mover holds %s; transfer aborted", quote(t.SKU))
		return
	case out && state == stock.TransferPending && p.cur.Available >= t.Quantity:
		step(stock.TransferDebited, stock.OpTransferOut)
	case out && state == stock.TransferPending:
		step(stock.TransferAborted, "")
		p.fail(i, stock.CodeOutOfStock, "not enough available stock to transfer; transfer aborted")
		return
	case !out && state == stock.TransferDebited:
		// Never refused for ShardCountMax: the units left the source
		// already and must land. CreateTransfer refused a move that would
		// take this shard past it, so only inflows racing the move can take
		// it past, by at most the moves in flight.
		step(stock.TransferCredited, stock.OpTransferIn)
	case !out && state == stock.TransferPending:
		p.fail(i, stock.CodeShardUnavailable, "transfer not debited yet")
		return
	case state == stock.TransferAborted:
		p.fail(i, stock.CodeOutOfStock, "transfer was aborted")
		return
	default: // the step was already taken
		p.results[i].Replayed = true
	}
	p.results[i].Transfer = &stock.Transfer{ID: t.ID, SKU: t.SKU, From: t.From, To: t.To, Quantity: t.Quantity, State: p.stepped[t.ID], CreatedAt: t.CreatedAt}
	if p.results[i].Transfer.State == "" {
		p.results[i].Transfer.State = state
	}
}

// expire ends a held reservation whose time is up.
func (p *planner) expire(res *stock.Reservation, source string) {
	res.State = stock.ReservationExpired
	p.giveBack(res)
	p.finish(res, stock.OpExpire, source, "expired")
}

// giveBack returns a reservation's units to its customer's quota.
func (p *planner) giveBack(res *stock.Reservation) {
	if p.read.SKU == nil || p.read.SKU.CustomerLimit == 0 || res.CustomerRef == "" {
		return
	}
	if p.w.UsageSub == nil {
		p.w.UsageSub = map[string]int64{}
	}
	p.w.UsageSub[res.CustomerRef] += res.Quantity
}

// finish records a reservation's end and its ledger entry.
func (p *planner) finish(res *stock.Reservation, kind stock.OpKind, source, reason string) {
	p.ended[res.ID] = res
	p.w.Ended = append(p.w.Ended, stock.ReservationEnd{ID: res.ID, State: res.State, Reason: reason})
	p.apply(&stock.LedgerEntry{Kind: kind, Quantity: res.Quantity, IdempotencyKey: res.IdempotencyKey,
		ReservationID: res.ID, OrderRef: res.OrderRef, Source: source, Reason: reason}, kind, res.Quantity)
}

// apply moves the running counts and appends the ledger entry.
func (p *planner) apply(e *stock.LedgerEntry, kind stock.OpKind, q int64) {
	e.Shard = p.shard
	e.Before = p.cur
	p.cur = p.cur.Add(kind.Delta(q))
	e.After = p.cur
	p.w.Ledger = append(p.w.Ledger, e)
}

func copyReservation(r *stock.Reservation) *stock.Reservation {
	c := *r
	return &c
}

func quote(s string) string { return "\"" + s + "\"" }
