package stock

import (
	"bytes"
	"errors"
	"fmt"
)

// EvaluateBatch decides a batch in memory: given the shard's counts, the
// batch's requests in arrival order and what the transaction read, it
// returns what to write and every request's result; with expireDue it also
// expires the due reservations of read.Due. It is pure (a rerun of the
// batch calls it again with a fresh read) and asserts that no count goes
// negative. A shard's writer calls it in its batch; anything that keeps the
// same books elsewhere than in Postgres (the load generator's in-memory
// ceiling) calls it too, so that it applies shardstock's rules and not a
// copy of them. A non-nil error wraps ErrInvariant.
//
// Requests are decided one after another, so a batch behaves exactly like
// the same requests applied one at a time: a key seen twice in one batch is a
// replay of its first occurrence, a reservation ended earlier in the batch is
// ended for the requests after it.
func EvaluateBatch(shard ShardKey, from Counts, reqs []*Request, read *BatchRead, expireDue bool) (*BatchWrite, []Result, error) {
	p := &planner{
		shard:   shard,
		read:    read,
		cur:     from,
		w:       &BatchWrite{From: from},
		results: make([]Result, len(reqs)),
		hashes:  make([][]byte, len(reqs)),
		seen:    map[string]int{},
		ended:   map[string]*Reservation{},
		stepped: map[string]TransferState{},
	}
	if read.SKU != nil {
		p.w.UsageLimit = read.SKU.CustomerLimit
	}
	for i, r := range reqs {
		switch {
		case r.Kind.Keyed():
			p.keyed(i, r)
		case r.Kind == OpCommit || r.Kind == OpRelease:
			p.end(i, r)
		case r.Kind == OpTransferOut || r.Kind == OpTransferIn:
			p.transfer(i, r)
		case r.Kind == OpWarm:
			p.results[i].Warmed = true // the batch read the row: nothing else to do
		}
	}
	if expireDue {
		for _, due := range read.Due {
			if _, done := p.ended[due.ID]; !done {
				p.expire(copyReservation(due), SourceSweeper)
			}
		}
	}
	p.w.To = p.cur
	if !p.cur.Valid() {
		// EvaluateBatch checks stock before every move, so this is a bug: refuse the
		// batch and halt the shard rather than write a negative count (the
		// CHECK constraints would refuse it too).
		return nil, nil, fmt.Errorf("%w: plan drove %s to %+v", ErrInvariant, shard, p.cur)
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

// ErrInvariant: a batch would break an invariant; its shard is halted.
var ErrInvariant = errors.New("stock: INVARIANT violated")

type planner struct {
	shard   ShardKey
	read    *BatchRead
	cur     Counts
	w       *BatchWrite
	results []Result
	hashes  [][]byte
	seen    map[string]int           // key -> first request in the batch
	ended   map[string]*Reservation  // reservations ended in this batch
	stepped map[string]TransferState // transfers stepped in this batch
}

func (p *planner) fail(i int, code Code, format string, args ...any) {
	p.results[i] = Result{Err: Errorf(code, format, args...)}
}

// keyed decides a reserve, deduct, replenish or adjust.
func (p *planner) keyed(i int, r *Request) {
	p.hashes[i] = ParamsHash(r)
	if j, ok := p.seen[r.Key]; ok {
		if !bytes.Equal(p.hashes[j], p.hashes[i]) {
			p.fail(i, CodeIdempotencyKeyReused, "idempotency_key %q was used with other parameters", r.Key)
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
	if err := p.refuse(r); err != nil {
		p.results[i] = Result{Err: err}
		return
	}
	op := &Operation{
		SKU: r.Shard.SKU, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, Shard: r.Shard.Index,
		ParamsHash: p.hashes[i], OrderRef: r.OrderRef, CustomerRef: r.CustomerRef, CreatedAt: p.read.Now,
	}
	entry := &LedgerEntry{Kind: r.Kind, Quantity: r.Quantity, IdempotencyKey: r.Key, OrderRef: r.OrderRef,
		Source: r.Source, Caller: r.Caller, Reason: r.Reason, Approver: r.Approver}
	if r.Kind == OpReserve {
		ttl := r.TTL
		if ttl == 0 {
			ttl = p.read.SKU.ReservationTTL
		}
		res := &Reservation{
			ID: NewReservationID(p.shard), SKU: p.shard.SKU, Shard: p.shard.Index, Quantity: r.Quantity,
			State: ReservationHeld, ExpiresAt: p.read.Now.Add(ttl), OrderRef: r.OrderRef,
			CustomerRef: r.CustomerRef, IdempotencyKey: r.Key,
		}
		op.ReservationID, op.ReservationState, op.ReservationExpiresAt = res.ID, res.State, res.ExpiresAt
		entry.ReservationID = res.ID
		p.w.NewReservations = append(p.w.NewReservations, res)
		p.results[i] = Result{Reservation: res, Operation: op}
	} else {
		p.results[i] = Result{Operation: op}
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

// refuse returns why a new keyed request cannot apply here, or nil.
func (p *planner) refuse(r *Request) *Error {
	sku := p.read.SKU
	if sku == nil {
		return Errorf(CodeSKUNotFound, "no sku %s", quote(r.Shard.SKU))
	}
	if r.Kind != OpReserve && r.Kind != OpDeduct {
		if r.Kind == OpAdjust && p.cur.Available+r.Quantity < 0 {
			return Errorf(CodeOutOfStock, "not enough available stock on this shard to remove")
		}
		// The ceiling is checked here, in memory against the running
		// counts, so that the batch never writes past it: nothing but an
		// inflow (this, or a transfer's credit) raises what a shard holds.
		if r.Quantity > 0 && r.Quantity > p.cur.Room() {
			return Errorf(CodeInvalidQuantity, "%s of %d would take this shard past %d units held (available plus reserved); it holds %d",
				r.Kind, r.Quantity, int64(ShardCountMax), p.cur.Available+p.cur.Reserved)
		}
		return nil
	}
	if err := sku.Refuse(r, p.usage(r.CustomerRef), p.read.Now); err != nil {
		return err
	}
	if p.shard.Index >= sku.Shards {
		// Out of service after SetShards: its stock is being moved away.
		// The allocator sweeps and finds it (or routes elsewhere).
		return Errorf(CodeOutOfStock, "this shard is being retired")
	}
	if p.cur.Available < r.Quantity {
		return Errorf(CodeOutOfStock, "not enough available stock")
	}
	return nil
}

// limited reports whether a request counts against a customer limit.
func (p *planner) limited(r *Request) bool {
	return p.read.SKU != nil && p.read.SKU.CustomerLimit > 0 && r.CustomerRef != "" &&
		(r.Kind == OpReserve || r.Kind == OpDeduct)
}

func (p *planner) usage(customer string) int64 {
	return p.read.Usage[customer] + p.w.UsageAdd[customer] - p.w.UsageSub[customer]
}

// replay answers a key that already has an operation: its first result if
// the parameters match, IDEMPOTENCY_KEY_REUSED if not. Storage reads only
// the SKU's own operations (BatchRead.Ops); an operation of another SKU
// here would be its bug, and is refused rather than replayed.
func (p *planner) replay(i int, r *Request, op *Operation) {
	if op.SKU != r.Shard.SKU || op.Kind != r.Kind || !bytes.Equal(op.ParamsHash, p.hashes[i]) {
		p.fail(i, CodeIdempotencyKeyReused, "idempotency_key %q was used with other parameters", r.Key)
		return
	}
	res := Result{Operation: op, Replayed: true}
	if op.Kind == OpReserve {
		state := op.ReservationState
		if ended := p.ended[op.ReservationID]; ended != nil {
			state = ended.State
		}
		res.Reservation = &Reservation{
			ID: op.ReservationID, SKU: op.SKU, Shard: op.Shard, Quantity: op.Quantity, State: state,
			ExpiresAt: op.ReservationExpiresAt, OrderRef: op.OrderRef, CustomerRef: op.CustomerRef, IdempotencyKey: op.IdempotencyKey,
		}
	}
	p.results[i] = res
}

// end decides a commit or a release. A reservation ends exactly once: the
// first of commit, release and expiry wins, the others report it.
func (p *planner) end(i int, r *Request) {
	res := p.ended[r.ReservationID]
	if res == nil {
		if got := p.read.Reservations[r.ReservationID]; got != nil {
			res = copyReservation(got)
		}
	}
	if res == nil || res.SKU != p.shard.SKU || res.Shard != p.shard.Index {
		p.fail(i, CodeReservationNotFound, "no reservation %s", quote(r.ReservationID))
		return
	}
	if res.State == ReservationHeld && !p.read.Now.Before(res.ExpiresAt) {
		p.expire(res, r.Source) // due but not yet swept: expire it first
	}
	commit := r.Kind == OpCommit
	switch res.State {
	case ReservationHeld:
		if commit {
			res.State = ReservationCommitted
		} else {
			res.State = ReservationReleased
			p.giveBack(res)
		}
		p.finish(res, r.Kind, r.Source, r.Caller, r.Reason)
		p.results[i] = Result{Reservation: res}
	case ReservationCommitted:
		if !commit {
			p.fail(i, CodeReservationAlreadyCommitted, "reservation is already committed")
			return
		}
		p.results[i] = Result{Reservation: res, Replayed: true}
	case ReservationReleased:
		if commit {
			p.fail(i, CodeReservationAlreadyReleased, "reservation was released")
			return
		}
		p.results[i] = Result{Reservation: res, Replayed: true}
	case ReservationExpired:
		if commit {
			p.fail(i, CodeReservationExpired, "reservation expired")
			return
		}
		p.results[i] = Result{Reservation: res, Replayed: true} // released by expiry already
	}
}

// transfer decides one step of a two-phase transfer: the source debits a
// pending transfer (or aborts it when it lacks the stock), the destination
// credits a debited one. A step already taken is a replay.
func (p *planner) transfer(i int, r *Request) {
	t := p.read.Transfers[r.TransferID]
	out := r.Kind == OpTransferOut
	if t == nil || t.SKU != p.shard.SKU || (out && t.From != p.shard.Index) || (!out && t.To != p.shard.Index) {
		p.fail(i, CodeInvalidArgument, "no transfer %s for this shard", quote(r.TransferID))
		return
	}
	state := t.State
	if s, ok := p.stepped[t.ID]; ok {
		state = s
	}
	step := func(next TransferState, kind OpKind) {
		p.stepped[t.ID] = next
		p.w.Steps = append(p.w.Steps, TransferStep{ID: t.ID, From: state, To: next})
		if kind != "" {
			p.apply(&LedgerEntry{Kind: kind, Quantity: t.Quantity, TransferID: t.ID, Source: r.Source, Reason: t.Reason}, kind, t.Quantity)
		}
	}
	switch {
	case out && state == TransferPending && t.FenceToken < p.read.MoveFences[t.SKU]:
		// A newer mover holds the SKU: this one's lease has gone, and its
		// move must not start (the step's statement checks the same).
		step(TransferAborted, "")
		p.fail(i, CodeMoveFenced, "a newer mover holds %s; transfer aborted", quote(t.SKU))
		return
	case out && state == TransferPending && p.cur.Available >= t.Quantity:
		step(TransferDebited, OpTransferOut)
	case out && state == TransferPending:
		step(TransferAborted, "")
		p.fail(i, CodeOutOfStock, "not enough available stock to transfer; transfer aborted")
		return
	case !out && state == TransferDebited:
		// Never refused for ShardCountMax: the units left the source
		// already and must land. CreateTransfer refused a move that would
		// take this shard past it, so only inflows racing the move can take
		// it past, by at most the moves in flight.
		step(TransferCredited, OpTransferIn)
	case !out && state == TransferPending:
		p.fail(i, CodeShardUnavailable, "transfer not debited yet")
		return
	case state == TransferAborted:
		p.fail(i, CodeOutOfStock, "transfer was aborted")
		return
	default: // the step was already taken
		p.results[i].Replayed = true
	}
	p.results[i].Transfer = &Transfer{ID: t.ID, SKU: t.SKU, From: t.From, To: t.To, Quantity: t.Quantity, State: p.stepped[t.ID], CreatedAt: t.CreatedAt}
	if p.results[i].Transfer.State == "" {
		p.results[i].Transfer.State = state
	}
}

// expire ends a held reservation whose time is up.
func (p *planner) expire(res *Reservation, source string) {
	res.State = ReservationExpired
	p.giveBack(res)
	p.finish(res, OpExpire, source, "", "expired")
}

// giveBack returns a reservation's units to its customer's quota.
func (p *planner) giveBack(res *Reservation) {
	if p.read.SKU == nil || p.read.SKU.CustomerLimit == 0 || res.CustomerRef == "" {
		return
	}
	if p.w.UsageSub == nil {
		p.w.UsageSub = map[string]int64{}
	}
	p.w.UsageSub[res.CustomerRef] += res.Quantity
}

// finish records a reservation's end and its ledger entry.
func (p *planner) finish(res *Reservation, kind OpKind, source, caller, reason string) {
	p.ended[res.ID] = res
	p.w.Ended = append(p.w.Ended, ReservationEnd{ID: res.ID, State: res.State, Reason: reason})
	p.apply(&LedgerEntry{Kind: kind, Quantity: res.Quantity, IdempotencyKey: res.IdempotencyKey,
		ReservationID: res.ID, OrderRef: res.OrderRef, Source: source, Caller: caller, Reason: reason}, kind, res.Quantity)
}

// apply moves the running counts and appends the ledger entry.
func (p *planner) apply(e *LedgerEntry, kind OpKind, q int64) {
	e.Shard = p.shard
	e.Before = p.cur
	p.cur = p.cur.Add(kind.Delta(q))
	e.After = p.cur
	p.w.Ledger = append(p.w.Ledger, e)
}

func copyReservation(r *Reservation) *Reservation {
	c := *r
	return &c
}

func quote(s string) string { return "\"" + s + "\"" }
