// Package admission sells a SKU under admission through purchase tokens
// and a waitlist (docs/admission.md). A token is a reservation taken
// through the allocator like every other hold, with a key derived from its
// request's (stock.TokenKey; Ticket.ReserveKey), so the shard servers'
// writers keep the invariants (no oversell, at most once, every change in
// the ledger) without a rule of their own. A request that finds units free
// and no ticket queued is granted its token directly (direct.go); the
// others are tickets in the admission store, in order of arrival; the
// tickets that found no free unit wait, and the Worker admits them as
// units come back, one SKU in one process at a time under an etcd lease.
package admission

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
)

// Store keeps the tickets (internal/postgres).
type Store interface {
	// EnterTickets records a batch of one SKU's requests for tokens, in
	// order, under the SKU's admission lock taken once.
	// route answers, before the lock, the entries that take no ticket.
	EnterTickets(ctx context.Context, sku string, entries []stock.TicketEntry, waitlistMax, perCustomer int64,
		free func(context.Context) (int64, bool, error), route stock.EntryRoute) ([]stock.TicketEntered, error)
	WaitTicket(ctx context.Context, id string, waitlistMax int64) (*stock.Ticket, error)
	DropTicket(ctx context.Context, id string) error
	ClaimTickets(ctx context.Context, ids []string) ([]string, error)
	// AdmitTickets marks a batch of tickets admitted with their tokens,
	// in one statement; nil for a ticket not found.
	AdmitTickets(ctx context.Context, marks []stock.TicketMark) ([]*stock.Ticket, error)
	CancelTicket(ctx context.Context, id string) (*stock.Ticket, error)
	SoldOutTicket(ctx context.Context, id string) (*stock.Ticket, error)
	SoldOutWaiting(ctx context.Context, sku string, stale time.Duration) (int64, error)
	GetTicket(ctx context.Context, id string) (*stock.Ticket, error)
	GetTicketByKey(ctx context.Context, sku, key string) (*stock.Ticket, error)
	// GetTickets reads tickets by id with their positions, in one
	// snapshot; a ticket not found is left out (watch.go).
	GetTickets(ctx context.Context, ids []string) ([]*stock.Ticket, error)
	// OpenTickets also answers the units asked for by the PENDING
	// tickets not claimed, in the same snapshot.
	OpenTickets(ctx context.Context, sku string, stale time.Duration, limit int) ([]*stock.Ticket, int64, error)
	OpenTicketSKUs(ctx context.Context, limit int) ([]string, error)
	WaitingCount(ctx context.Context, sku string) (int64, error)
	WaitingTotal(ctx context.Context) (int64, error)
	// TicketKeys calls each with the keys of sku's tickets, at most limit,
	// under the SKU's admission lock, and returns how many it found (up to
	// limit+1) and whether a ticket was open (pending, waiting or
	// registered) then (memory.go).
	TicketKeys(ctx context.Context, sku string, limit int, each func(key string)) (n int, open bool, err error)

	// The draw (draw.go).
	RegisterTicket(ctx context.Context, t stock.Ticket, params []byte, registrationsMax int64, open bool,
		granted func(context.Context) (*stock.Ticket, error)) (*stock.Ticket, bool, error)
	SeedDraw(ctx context.Context, sku string, seed []byte) ([]byte, error)
	RankDraw(ctx context.Context, sku string, order func(seed []byte, ids []string) []string) (bool, error)
	GetDraw(ctx context.Context, sku string, after int64, limit int) (*stock.Draw, error)
}

// Seller takes and gives back holds (the allocator).
type Seller interface {
	Allocate(ctx context.Context, r *stock.Request) stock.Result
	EndReservation(ctx context.Context, r *stock.Request) stock.Result
	SKU(ctx context.Context, name string) (*stock.SKU, error)
	// Availability reads the SKU's units available and whether it is sold
	// out for good, in one snapshot (the allocator's sold-out check).
	Availability(ctx context.Context, sku string) (available int64, soldOut bool, err error)
	// SoldOutMark reports whether this process's view of the sold-out
	// marks, fresh, marks sku sold out for good, and the mark's revision
	// (docs/soldout.md).
	SoldOutMark(sku string) (rev int64, marked bool)
	// OperationKeyNew reports whether this process's set of sku's
	// operation keys, read under the mark rev, lacks key; false while the
	// set is not there (it is read in the background).
	OperationKeyNew(sku string, rev int64, key string) bool
	// GetOperation reads the operation recorded under a key
	// (OPERATION_NOT_FOUND, OPERATION_IN_PROGRESS while in flight here).
	GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error)
	// LookupOperations reads the operations of keys in one round trip;
	// busy: keys found in none that a request here may still apply.
	LookupOperations(ctx context.Context, sku string, keys []string) (ops map[string]*stock.Operation, busy map[string]bool, err error)
}

// Service answers the admission calls of InventoryService.
type Service struct {
	store   Store
	seller  Seller
	metrics *metrics
	memory  *memory
	// entries batches a SKU's RequestTokens into one entry transaction;
	// marks batches admitted marks into one statement (batch.go).
	entries *batcher[entryIn, stock.TicketEntered]
	marks   *batcher[stock.TicketMark, *stock.Ticket]
	// AfterReserve, for tests, runs between a ticket's reserve and its
	// mark: an error stops the admission there, as a crash would.
	AfterReserve func(t *stock.Ticket) error
	// AfterSeed, for tests, runs once a draw's seed is recorded, before
	// its order is: an error stops the draw there, as a crash would.
	AfterSeed func(sku string, seed []byte) error
	// For tests, which order a race with them: BeforeReenter runs when a
	// request whose direct grant found no unit free is about to enter as
	// a ticket; EntryQueued when a request has joined its SKU's entry
	// queue (direct: it asks for a direct grant); EntryBatch before a
	// batch of a SKU's entries is served, with their keys in order.
	BeforeReenter func(key string)
	EntryQueued   func(sku, key string, direct bool)
	EntryBatch    func(sku string, keys []string)
	// now is the clock that closes a draw's registration.
	now func() time.Time
	// watches serves the WatchTicket streams from one look (watch.go).
	watches watches
	// opened wakes this process's idle Worker when a ticket is entered
	// (open): one pending wake is enough, a look sees every ticket.
	opened chan struct{}
	// untick holds, per SKU, when the last read that found it never
	// ticketed began (direct.go).
	untick untickets
}

// New returns a Service; reg, when set, receives its metrics.
func New(store Store, seller Seller, reg prometheus.Registerer) *Service {
	s := &Service{store: store, seller: seller, metrics: newMetrics(reg, store), memory: newMemory(), now: time.Now,
		watches: watches{store: store}, opened: make(chan struct{}, 1)}
	s.entries = newBatcher(entryBatchLenMax, entryBatchesMax, s.enterBatch)
	s.entries.queued = func(sku string, in entryIn) {
		if s.EntryQueued != nil {
			s.EntryQueued(sku, in.entry.Ticket.IdempotencyKey, in.entry.Direct)
		}
	}
	s.marks = newBatcher(markBatchLenMax, 0, s.markBatch)
	return s
}

// entryIn is one RequestToken in a batch of its SKU's entries.
type entryIn struct {
	entry stock.TicketEntry
	ad    stock.Admission
}

// enterBatch enters a batch of sku's tickets in one transaction, with the
// SKU's admission as the newest request of the batch read it.
func (s *Service) enterBatch(sku string, ins []entryIn) ([]stock.TicketEntered, error) {
	ctx, cancel := context.WithTimeout(context.Background(), batchWaitMax)
	defer cancel()
	ad := ins[len(ins)-1].ad
	entries := make([]stock.TicketEntry, len(ins))
	for i, in := range ins {
		entries[i] = in.entry
	}
	if s.EntryBatch != nil {
		keys := make([]string, len(entries))
		for i, e := range entries {
			keys[i] = e.Ticket.IdempotencyKey
		}
		s.EntryBatch(sku, keys)
	}
	return s.store.EnterTickets(ctx, sku, entries, ad.WaitlistMax, ad.TokensPerCustomer, func(ctx context.Context) (int64, bool, error) {
		return s.seller.Availability(ctx, sku)
	}, s.route(sku))
}

// route answers, in an entry batch before the SKU's lock, the entries
// that take no ticket (docs/admission.md, "Direct grants"): with no ticket
// queued, each that may (Direct) reserves its token directly. Every other
// whose key already holds a token granted directly (a retry, though the
// SKU's settings may have changed since) gets that token back, replayed:
// entered, it would wait for a second turn, or be answered SOLD_OUT while
// its holder has the units.
func (s *Service) route(sku string) stock.EntryRoute {
	return func(ctx context.Context, counts stock.EntryCounts, entries []stock.TicketEntry, fresh []int, out []stock.TicketEntered) []int {
		s.untick.saw(sku, counts)
		look := fresh[:0:0]
		for _, i := range fresh {
			if entries[i].Direct && counts.Queued == 0 {
				out[i] = stock.TicketEntered{Direct: true}
			} else {
				look = append(look, i)
			}
		}
		return s.grantedTokens(ctx, sku, entries, look, out)
	}
}

// grantedTokens answers, in out, the entries of idx whose key holds a
// token granted directly (its reserve under stock.TokenKey), as that
// token, replayed, or IDEMPOTENCY_KEY_REUSED for other parameters; one
// read for all. It returns the others, in order.
func (s *Service) grantedTokens(ctx context.Context, sku string, entries []stock.TicketEntry, idx []int, out []stock.TicketEntered) []int {
	if len(idx) == 0 {
		return nil
	}
	keys := make([]string, len(idx))
	for j, i := range idx {
		keys[j] = stock.TokenKey(sku, entries[i].Ticket.IdempotencyKey)
	}
	ops, busy, err := s.seller.LookupOperations(ctx, sku, keys)
	var rest []int
	for j, i := range idx {
		t := entries[i].Ticket
		op := ops[keys[j]]
		want := stock.ParamsHash(&stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: sku}, Quantity: t.Quantity,
			CustomerRef: t.CustomerRef})
		switch {
		case err != nil:
			out[i].Err = unavailable(err)
		case busy[keys[j]]:
			out[i].Err = stock.Errorf(stock.CodeShardUnavailable, "a token for this key is being granted; retry with the same key")
		case op == nil:
			rest = append(rest, i)
		case op.Kind != stock.OpReserve || !bytes.Equal(op.ParamsHash, want):
			out[i].Err = stock.Errorf(stock.CodeIdempotencyKeyReused, "idempotency_key was used with other parameters")
		default:
			// The key's ticket, if it has one, replaces this answer
			// (the store's EnterTickets): its admission reserves under the
			// same key.
			out[i] = stock.TicketEntered{Ticket: directTicket(t, op.ReservationID, op.ReservationExpiresAt), Replayed: true}
		}
	}
	return rest
}

// directTicket is the answer for a token granted directly: an ADMITTED
// ticket that was never recorded (no id, no place in the waitlist).
func directTicket(t stock.Ticket, tokenID string, expiresAt time.Time) *stock.Ticket {
	t.ID, t.State, t.TokenID, t.ExpiresAt, t.Direct = "", stock.TicketAdmitted, tokenID, expiresAt, true
	return &t
}

// markBatch marks a batch of tickets admitted, of any SKUs, in one
// statement.
func (s *Service) markBatch(_ string, marks []stock.TicketMark) ([]*stock.Ticket, error) {
	ctx, cancel := context.WithTimeout(context.Background(), batchWaitMax)
	defer cancel()
	return s.store.AdmitTickets(ctx, marks)
}

// TokenRequest is a RequestToken call.
type TokenRequest struct {
	SKU         string
	Quantity    int64
	Key         string
	CustomerRef string // the verified customer's, when there is one
	Caller      string // for the ledger (stock.Request.Caller)
}

// Answer is RequestToken's answer: the ticket, ADMITTED (its token) or
// WAITING (its position).
type Answer struct {
	Ticket   *stock.Ticket
	Replayed bool
}

// RequestToken answers a token while units are free and no ticket waits,
// else a ticket in the waitlist; OUT_OF_STOCK once the SKU is sold out for
// good (from memory for a new key once every allocator knows it);
// WAITLIST_FULL at waitlist_max.
func (s *Service) RequestToken(ctx context.Context, r TokenRequest) (Answer, error) {
	a, err := s.requestToken(ctx, r)
	return a, unavailable(err)
}

// unavailable answers a failure that is no answer of the service's (the
// tickets' database down or cut off mid-call, a read that did not finish)
// SHARD_UNAVAILABLE rather than INTERNAL: every admission call is safe to
// retry, RequestToken with the same key (its ticket is found again by
// it), the others with the same ticket, and the API asks clients to retry
// exactly that code. A domain error and a cancelled call are left as
// they are.
func unavailable(err error) error {
	var e *stock.Error
	if err == nil || errors.As(err, &e) || errors.Is(err, context.Canceled) {
		return err
	}
	return stock.Errorf(stock.CodeShardUnavailable, "the tickets' database did not answer; retry with the same key or ticket")
}

func (s *Service) requestToken(ctx context.Context, r TokenRequest) (Answer, error) {
	sku, err := s.validate(ctx, r)
	if err != nil {
		return Answer{}, err
	}
	if s.fromMemory(sku, r.Key) {
		return Answer{}, stock.Errorf(stock.CodeOutOfStock, "sku %q is sold out", r.SKU)
	}
	ad := sku.Admission
	if ad.Mode == stock.AdmissionDraw {
		return s.register(ctx, r, sku)
	}
	// Concurrent requests of the SKU in this process enter together: one
	// transaction, the SKU's lock taken once.
	in := entryIn{ad: ad, entry: stock.TicketEntry{Params: paramsHash(r), Direct: ad.Direct(),
		Ticket: stock.Ticket{SKU: r.SKU, Quantity: r.Quantity, IdempotencyKey: r.Key, CustomerRef: r.CustomerRef}}}
	var e stock.TicketEntered
	if ad.Direct() && s.untick.trusted(r.SKU) {
		// The SKU has never had a ticket: no key of it can have one, and
		// none is queued (direct.go).
		e.Direct = true
	} else if e, err = s.entries.do(ctx, r.SKU, in); err != nil {
		return Answer{}, err
	}
	if e.Direct {
		a, granted, err := s.grant(ctx, r, sku)
		if granted || err != nil {
			return a, err
		}
		// No unit free: the request enters, and waits. This process's
		// next requests enter too (their batches read the counts, and go
		// after this one): a unit that comes back while the SKU's first
		// ticket is entered goes to a request in line, not to a newer one.
		s.untick.forget(r.SKU)
		in.entry.Direct = false
		if s.BeforeReenter != nil {
			s.BeforeReenter(r.Key)
		}
		if e, err = s.entries.do(ctx, r.SKU, in); err != nil {
			return Answer{}, err
		}
		if e.Direct {
			// A copy of the same key, sent at once and still asking
			// directly, went first in the batch: its answer is this one's.
			return Answer{}, stock.Errorf(stock.CodeShardUnavailable, "a copy of this request is being served; retry with the same key")
		}
	}
	if e.Err != nil {
		return Answer{}, e.Err
	}
	t, replayed := e.Ticket, e.Replayed
	if t.ID == "" {
		return answer(t, replayed) // a token granted directly, found again by its key
	}
	if !replayed {
		s.wake()
	}
	if !replayed && t.State == stock.TicketWaiting {
		s.metrics.waiting.Inc()
	}
	if t.State == stock.TicketPending {
		// New, or a retry of a request that did not finish (its reserve
		// in doubt): the reserve's key is the ticket's, so a retry cannot
		// take a second hold.
		t, err = s.serve(ctx, t, sku, r.Caller)
		if err != nil {
			return Answer{}, err
		}
	}
	return answer(t, replayed)
}

// grant reserves a token directly, with no ticket (docs/admission.md,
// "Direct grants"), under the key its ticket's admission would use
// (stock.TokenKey): granted, the token (replayed for a retry); not granted
// and no error, no unit was free and the request should wait; any other
// refusal is the answer, and nothing was recorded.
func (s *Service) grant(ctx context.Context, r TokenRequest, sku *stock.SKU) (Answer, bool, error) {
	res := s.seller.Allocate(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: r.SKU}, Quantity: r.Quantity,
		Key: stock.TokenKey(r.SKU, r.Key), CustomerRef: r.CustomerRef, TTL: sku.Admission.TokenTTL, Source: stock.SourceAdmission,
		Caller: r.Caller})
	switch {
	case res.Err == nil:
	case res.Err.Code == stock.CodeOutOfStock:
		return Answer{}, false, nil
	default:
		return Answer{}, false, res.Err
	}
	if !res.Replayed {
		s.metrics.granted.Inc()
		s.metrics.direct.Inc()
	}
	t := directTicket(stock.Ticket{SKU: r.SKU, Quantity: r.Quantity, IdempotencyKey: r.Key, CustomerRef: r.CustomerRef},
		res.Reservation.ID, res.Reservation.ExpiresAt)
	return Answer{Ticket: t, Replayed: res.Replayed}, true, nil
}

// wake tells this process's Worker that a ticket was entered, without
// waiting: one wake pending is as good as many.
func (s *Service) wake() {
	select {
	case s.opened <- struct{}{}:
	default:
	}
}

// answer turns a ticket into RequestToken's answer: a sold-out ticket is
// OUT_OF_STOCK, as when it was first answered.
func answer(t *stock.Ticket, replayed bool) (Answer, error) {
	if t.State == stock.TicketSoldOut {
		return Answer{}, stock.Errorf(stock.CodeOutOfStock, "sku %q is sold out", t.SKU)
	}
	return Answer{Ticket: t, Replayed: replayed}, nil
}

// validate checks a request's shape and the SKU's admission; every refusal
// here changes nothing.
func (s *Service) validate(ctx context.Context, r TokenRequest) (*stock.SKU, error) {
	if err := stock.ValidateSKU(r.SKU); err != nil {
		return nil, err
	}
	if err := stock.ValidateQuantity(r.Quantity); err != nil {
		return nil, err
	}
	if err := stock.ValidateKey(r.Key); err != nil {
		return nil, err
	}
	if err := stock.ValidateText("customer_ref", r.CustomerRef, stock.RefLenMax); err != nil {
		return nil, err
	}
	sku, err := s.seller.SKU(ctx, r.SKU)
	if err != nil {
		return nil, err
	}
	switch ad := sku.Admission; {
	case !ad.On():
		return nil, stock.Errorf(stock.CodeInvalidArgument, "sku %q is not under admission: use Reserve", r.SKU)
	case ad.TokensPerCustomer > 0 && r.CustomerRef == "":
		return nil, stock.Errorf(stock.CodeCustomerRefRequired, "sku %q has tokens_per_customer: customer_ref is required", r.SKU)
	case ad.Mode == stock.AdmissionDraw && r.CustomerRef == "":
		// One registration per customer: a draw without customers is won
		// by whoever sends the most keys.
		return nil, stock.Errorf(stock.CodeCustomerRefRequired, "sku %q sells by draw: customer_ref is required", r.SKU)
	case sku.MaxPerOrder > 0 && r.Quantity > sku.MaxPerOrder:
		// Refused now, not when the ticket's turn comes.
		return nil, stock.Errorf(stock.CodeQuantityAboveMaxPerOrder, "quantity is above the sku's max_per_order")
	}
	return sku, nil
}

// paramsHash names what a key was first used for: the same key with
// another quantity or customer is IDEMPOTENCY_KEY_REUSED.
func paramsHash(r TokenRequest) []byte {
	h := sha256.New()
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(r.Quantity)))
	h.Write([]byte(r.CustomerRef))
	return h.Sum(nil)
}

// serve tries to admit a PENDING ticket at once. No unit free: the ticket
// waits (or the SKU is sold out for good, or the waitlist is full). A
// definite refusal forgets the ticket; any other failure leaves it PENDING
// for a retry of its key or the worker (which takes it once it is
// pendingStale old).
func (s *Service) serve(ctx context.Context, t *stock.Ticket, sku *stock.SKU, caller string) (*stock.Ticket, error) {
	got, res := s.admit(ctx, t, sku, caller, true)
	if res.Err == nil {
		return got, nil
	}
	switch code := res.Err.Code; {
	case code == stock.CodeOutOfStock:
		gone, err := s.soldOutForGood(ctx, t.SKU)
		if err != nil {
			return nil, err
		}
		if gone {
			return s.store.SoldOutTicket(ctx, t.ID)
		}
		w, err := s.store.WaitTicket(ctx, t.ID, sku.Admission.WaitlistMax)
		if err == nil && w.State == stock.TicketWaiting {
			s.metrics.waiting.Inc()
		}
		return w, err
	case code.Definite():
		if err := s.store.DropTicket(ctx, t.ID); err != nil {
			return nil, err
		}
	}
	return nil, res.Err
}

// admit reserves t's units with the ticket's own key and the SKU's token
// TTL, then marks the ticket ADMITTED with that token. The reserve comes
// first: a crash between the two leaves a hold that the next attempt
// (same key) gets back as a replay, never a second one. A ticket that
// ended meanwhile (cancelled) gives its token back.
func (s *Service) admit(ctx context.Context, t *stock.Ticket, sku *stock.SKU, caller string, direct bool) (*stock.Ticket, stock.Result) {
	res := s.seller.Allocate(ctx, &stock.Request{Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: t.SKU}, Quantity: t.Quantity,
		Key: t.ReserveKey(), CustomerRef: t.CustomerRef, TTL: sku.Admission.TokenTTL, Source: stock.SourceAdmission, Caller: caller})
	if res.Err != nil {
		return nil, res
	}
	if s.AfterReserve != nil {
		if err := s.AfterReserve(t); err != nil {
			return nil, stock.ErrResult(err, stock.Errorf(stock.CodeShardUnavailable, "admission stopped: %v", err))
		}
	}
	rsv := res.Reservation
	// Marked with the other admissions of the moment, in one statement.
	got, err := s.marks.do(ctx, "", stock.TicketMark{ID: t.ID, TokenID: rsv.ID, ExpiresAt: rsv.ExpiresAt, Direct: direct})
	if err == nil && got == nil {
		err = stock.Errorf(stock.CodeTicketNotFound, "no ticket %q", t.ID)
	}
	if err != nil {
		return nil, stock.ErrResult(err, stock.Errorf(stock.CodeShardUnavailable, "the ticket could not be marked admitted; retry"))
	}
	if got.TokenID != rsv.ID {
		// The ticket ended otherwise before it was marked: the hold is
		// no one's.
		s.seller.EndReservation(ctx, &stock.Request{Kind: stock.OpRelease, ReservationID: rsv.ID, Reason: "ticket " + string(got.State),
			Source: stock.SourceAdmission})
		return got, stock.Result{}
	}
	if !res.Replayed {
		s.metrics.granted.Inc()
		if !direct {
			s.metrics.admitted.Inc()
		}
	}
	return got, stock.Result{}
}

// soldOutForGood reports whether nothing of sku is available, held or in
// transit: only a replenish or an adjustment can bring stock back.
func (s *Service) soldOutForGood(ctx context.Context, sku string) (bool, error) {
	_, gone, err := s.seller.Availability(ctx, sku)
	return gone, err
}

// GetTicket reads a ticket by id, or by sku and key when id is "".
func (s *Service) GetTicket(ctx context.Context, id, sku, key string) (*stock.Ticket, error) {
	if id != "" {
		if err := validTicketID(id); err != nil {
			return nil, err
		}
		t, err := s.store.GetTicket(ctx, id)
		return t, unavailable(err)
	}
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if err := stock.ValidateKey(key); err != nil {
		return nil, err
	}
	t, err := s.store.GetTicketByKey(ctx, sku, key)
	if stock.CodeOf(err) == stock.CodeTicketNotFound {
		// A token granted directly has no ticket: its reservation is its
		// record.
		op, lookErr := s.seller.GetOperation(ctx, sku, stock.TokenKey(sku, key))
		switch {
		case lookErr == nil && op.Kind == stock.OpReserve:
			return directTicket(stock.Ticket{SKU: sku, Quantity: op.Quantity, IdempotencyKey: key, CustomerRef: op.CustomerRef},
				op.ReservationID, op.ReservationExpiresAt), nil
		case lookErr != nil && stock.CodeOf(lookErr) != stock.CodeOperationNotFound:
			return nil, unavailable(lookErr)
		}
	}
	return t, unavailable(err)
}

// ticketIDLenMax bounds a ticket id: "tkt_" and 32 hex digits.
const ticketIDLenMax = 36

func validTicketID(id string) error {
	if id == "" || len(id) > ticketIDLenMax {
		return stock.Errorf(stock.CodeInvalidArgument, "ticket_id must be 1 to %d characters", ticketIDLenMax)
	}
	return stock.ValidateText("ticket_id", id, ticketIDLenMax)
}

// CancelTicket takes a waiting ticket out of the waitlist; customer, when
// set (a verified customer's call), must be the ticket's.
func (s *Service) CancelTicket(ctx context.Context, id, customer string) (*stock.Ticket, error) {
	if err := validTicketID(id); err != nil {
		return nil, err
	}
	if customer != "" {
		t, err := s.store.GetTicket(ctx, id)
		if err != nil {
			return nil, unavailable(err)
		}
		if t.CustomerRef != customer {
			return nil, stock.Errorf(stock.CodeTicketNotFound, "no ticket %q", id)
		}
	}
	t, err := s.store.CancelTicket(ctx, id)
	if err == nil && t.State == stock.TicketCancelled {
		s.metrics.cancelled.Inc()
	}
	return t, unavailable(err)
}

// Waitlist returns the number of sku's tickets waiting.
func (s *Service) Waitlist(ctx context.Context, sku string) (int64, error) {
	n, err := s.store.WaitingCount(ctx, sku)
	return n, unavailable(err)
}
