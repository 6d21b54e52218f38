package stock

import (
	"bytes"
	"errors"
	"fmt"
	"time"
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
		refunds: map[string]int64{},
		applied: map[string]string{},
	}
	if read.SKU != nil {
		p.w.UsageLimit = read.SKU.CustomerLimit
	}
	for i, r := range reqs {
		switch {
		case r.Kind.Keyed():
			p.keyed(i, r)
		case r.Kind == OpCommit || r.Kind == OpRelease || r.Kind == OpExtend:
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
	ended   map[string]*Reservation  // reservations ended or extended in this batch
	stepped map[string]TransferState // transfers stepped in this batch
	refunds map[string]int64         // sale -> units refunded in this batch
	applied map[string]string        // OrderName -> key, applied in this batch
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
	var sale *soldUnits
	if r.Kind == OpRefund {
		var code Code
		var msg string
		if sale, code, msg = p.sale(r); code != "" {
			p.fail(i, code, "%s", msg)
			return
		}
	} else if err := p.refuse(r); err != nil {
		p.results[i] = Result{Err: err}
		return
	} else if first := p.orderApplied(r); first != "" {
		p.fail(i, CodeOrderAlreadyApplied, "order_ref %q was applied (%s) by idempotency_key %q", r.OrderRef, r.Kind, first)
		return
	}
	op := &Operation{
		SKU: r.Shard.SKU, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, Shard: r.Shard.Index,
		ParamsHash: p.hashes[i], OrderRef: r.OrderRef, CustomerRef: r.CustomerRef, CreatedAt: p.read.Now,
		Original: r.Original,
	}
	entry := &LedgerEntry{Kind: r.Kind, Quantity: r.Quantity, IdempotencyKey: r.Key, OrderRef: r.OrderRef,
		Original: r.Original, Source: r.Source, Caller: r.Caller, Reason: r.Reason, Approver: r.Approver}
	if sale != nil {
		// A refund is the sale's: its order and customer, whose quota
		// the units return to.
		op.OrderRef, op.CustomerRef, entry.OrderRef = sale.orderRef, sale.customer, sale.orderRef
		p.refunds[sale.id] += r.Quantity
		p.w.Refunds = append(p.w.Refunds, RefundAdd{SKU: r.Shard.SKU, Sale: sale.id, Sold: sale.sold, Quantity: r.Quantity})
		p.giveBack(sale.customer, r.Quantity)
	}
	if r.Kind == OpReserve {
		ttl := r.TTL
		if ttl == 0 {
			ttl = p.read.SKU.ReservationTTL
		}
		res := &Reservation{
			ID: NewReservationID(p.shard), SKU: p.shard.SKU, Shard: p.shard.Index, Quantity: r.Quantity,
			State: ReservationHeld, ExpiresAt: p.read.Now.Add(ttl), OrderRef: r.OrderRef,
			CustomerRef: r.CustomerRef, IdempotencyKey: r.Key, CreatedAt: p.read.Now,
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
	if p.oncePerOrder(r) {
		name := OrderName(r.OrderRef, r.Kind)
		p.applied[name] = r.Key
		p.w.Applied = append(p.w.Applied, OrderApplied{SKU: r.Shard.SKU, OrderRef: r.OrderRef, Kind: r.Kind, Key: r.Key})
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

// oncePerOrder reports whether the request's order_ref may be applied
// once for its kind: a reserve or deduct naming an order, on a SKU with
// OnePerOrder. Refunds are capped by their sale instead.
func (p *planner) oncePerOrder(r *Request) bool {
	return p.read.SKU != nil && p.read.SKU.OnePerOrder && r.OrderRef != "" && (r.Kind == OpReserve || r.Kind == OpDeduct)
}

// orderApplied returns the key that applied the request's order_ref for
// its kind already, or "": the read's, or one earlier in this batch.
func (p *planner) orderApplied(r *Request) string {
	if !p.oncePerOrder(r) {
		return ""
	}
	name := OrderName(r.OrderRef, r.Kind)
	if k := p.applied[name]; k != "" {
		return k
	}
	return p.read.Applied[name]
}

// soldUnits is what a refund reads of its sale.
type soldUnits struct {
	id                 string // Sale.ID
	sold               int64
	orderRef, customer string
}

// sale returns the sale a refund reverses, or why the refund cannot
// apply: no such sale of the SKU, or more than it sold in all with the
// refunds before (read, and earlier in this batch). The cap is what the
// sale sold, wherever the refund lands; storage guards the sale's
// refunded units against it (RefundAdd), so that refunds of one sale on
// two shards cannot both pass it.
func (p *planner) sale(r *Request) (*soldUnits, Code, string) {
	sku := p.read.SKU
	if sku == nil {
		return nil, CodeSKUNotFound, "no sku " + quote(r.Shard.SKU)
	}
	s := &soldUnits{id: r.Original.ID()}
	switch {
	case r.Original.DeductKey != "":
		op := p.read.Ops[r.Original.DeductKey]
		if j, ok := p.seen[r.Original.DeductKey]; ok && op == nil {
			op = p.results[j].Operation
		}
		if op == nil || op.Kind != OpDeduct || op.SKU != r.Shard.SKU {
			return nil, CodeSaleNotFound, "no deduct of " + quote(r.Shard.SKU) + " with key " + quote(r.Original.DeductKey)
		}
		s.sold, s.orderRef, s.customer = op.Quantity, op.OrderRef, op.CustomerRef
	default:
		res := p.ended[r.Original.ReservationID]
		if res == nil {
			res = p.read.Reservations[r.Original.ReservationID]
		}
		if res == nil || res.SKU != r.Shard.SKU || res.State != ReservationCommitted {
			return nil, CodeSaleNotFound, "no committed reservation " + quote(r.Original.ReservationID) + " of " + quote(r.Shard.SKU)
		}
		s.sold, s.orderRef, s.customer = res.bought(), res.OrderRef, res.CustomerRef
	}
	if done := p.read.Refunded[s.id] + p.refunds[s.id]; done+r.Quantity > s.sold {
		return nil, CodeRefundExceedsSale, fmt.Sprintf("the sale sold %d, %d refunded already: a refund of %d would exceed it", s.sold, done, r.Quantity)
	}
	if p.cur.Sold < r.Quantity {
		// Sold moves back to available on the refund's shard, which must
		// have sold as much: the sale's own shard always has.
		return nil, CodeInvalidArgument, "this shard sold fewer units than the refund: refund on the sale's shard"
	}
	if r.Quantity > p.cur.Room() {
		return nil, CodeInvalidQuantity, fmt.Sprintf("a refund of %d would take this shard past %d units held", r.Quantity, int64(ShardCountMax))
	}
	return s, "", ""
}

// bought is the units a committed reservation sold.
func (r *Reservation) bought() int64 {
	if r.Committed > 0 {
		return r.Committed
	}
	return r.Quantity
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
	if IsOrderLineKey(res.IdempotencyKey) && r.Source != SourceOrder {
		// An order ends as a whole: its lines only with it.
		p.fail(i, CodeInvalidArgument, "reservation %s is a line of an order: commit or release the order", quote(r.ReservationID))
		return
	}
	if res.State == ReservationHeld && !p.read.Now.Before(res.ExpiresAt) {
		p.expire(res, r.Source) // due but not yet swept: expire it first
	}
	commit := r.Kind == OpCommit
	switch {
	case res.State == ReservationHeld && r.Kind == OpExtend:
		p.extend(i, r, res)
	case res.State == ReservationHeld && commit:
		q := r.Quantity
		if q == 0 {
			q = res.Quantity
		}
		if q > res.Quantity {
			p.fail(i, CodeInvalidQuantity, "quantity %d is more than the %d units held", q, res.Quantity)
			return
		}
		// A partial commit buys q and releases the rest in the same step:
		// a commit entry of q, then a release entry of the rest.
		res.State, res.Committed = ReservationCommitted, q
		p.finish(res, OpCommit, r.Source, r.Caller, r.Reason, q)
		if rest := res.Quantity - q; rest > 0 {
			p.giveBack(res.CustomerRef, rest)
			p.record(res, OpRelease, r.Source, r.Caller, "partial commit: the rest released", rest)
		}
		p.results[i] = Result{Reservation: res}
	case res.State == ReservationHeld:
		res.State = ReservationReleased
		p.giveBack(res.CustomerRef, res.Quantity)
		p.finish(res, r.Kind, r.Source, r.Caller, r.Reason, res.Quantity)
		p.results[i] = Result{Reservation: res}
	case r.Kind == OpExtend:
		p.fail(i, endedCodes[res.State], "reservation is %s: it can no longer be extended", res.State)
	default:
		p.answerEnded(i, res, commit)
	}
}

// endedCodes are the refusals of a change to a reservation that ended.
var endedCodes = map[ReservationState]Code{
	ReservationCommitted: CodeReservationAlreadyCommitted,
	ReservationReleased:  CodeReservationAlreadyReleased,
	ReservationExpired:   CodeReservationExpired,
}

// extend moves a held reservation's expiry to now + ttl, within its SKU's
// max_hold from when it was made. It never shortens a hold: an expiry at
// or after the new one is answered as a replay, and nothing is written.
func (p *planner) extend(i int, r *Request, res *Reservation) {
	hold := MaxHoldDefault
	if p.read.SKU != nil && p.read.SKU.MaxHold > 0 {
		hold = p.read.SKU.MaxHold
	}
	at := p.read.Now.Add(r.TTL)
	if limit := res.CreatedAt.Add(hold); at.After(limit) {
		p.fail(i, CodeHoldLimitReached, "the sku holds a reservation at most %s: it can be extended until %s", hold, limit.UTC().Format(time.RFC3339))
		return
	}
	if !at.After(res.ExpiresAt) {
		p.results[i] = Result{Reservation: res, Replayed: true}
		return
	}
	res.ExpiresAt = at
	p.ended[res.ID] = res
	p.w.Extended = append(p.w.Extended, ReservationExtend{ID: res.ID, ExpiresAt: at})
	p.record(res, OpExtend, r.Source, r.Caller, "extended until "+at.UTC().Format(time.RFC3339Nano), res.Quantity)
	p.results[i] = Result{Reservation: res}
}

// answerEnded answers a commit or release of a reservation that ended before.
func (p *planner) answerEnded(i int, res *Reservation, commit bool) {
	switch res.State {
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
	p.giveBack(res.CustomerRef, res.Quantity)
	p.finish(res, OpExpire, source, "", "expired", res.Quantity)
}

// giveBack returns q units to a customer's quota.
func (p *planner) giveBack(customer string, q int64) {
	if p.read.SKU == nil || p.read.SKU.CustomerLimit == 0 || customer == "" {
		return
	}
	if p.w.UsageSub == nil {
		p.w.UsageSub = map[string]int64{}
	}
	p.w.UsageSub[customer] += q
}

// finish records a reservation's end and its ledger entry, of q units.
func (p *planner) finish(res *Reservation, kind OpKind, source, caller, reason string, q int64) {
	p.ended[res.ID] = res
	p.w.Ended = append(p.w.Ended, ReservationEnd{ID: res.ID, State: res.State, Reason: reason, Committed: res.Committed})
	p.record(res, kind, source, caller, reason, q)
}

// record appends a ledger entry of a reservation's, of q units.
func (p *planner) record(res *Reservation, kind OpKind, source, caller, reason string, q int64) {
	p.apply(&LedgerEntry{Kind: kind, Quantity: q, IdempotencyKey: res.IdempotencyKey,
		ReservationID: res.ID, OrderRef: res.OrderRef, Source: source, Caller: caller, Reason: reason}, kind, q)
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
