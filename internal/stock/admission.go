package stock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"time"
)

// AdmissionMode is how a SKU under admission hands out purchase tokens
// (docs/admission.md); "" is no admission.
type AdmissionMode string

const (
	AdmissionOff    AdmissionMode = ""
	AdmissionTokens AdmissionMode = "tokens"
	// AdmissionDraw: customers register until DrawAt, then a draw orders
	// the registrations and the worker admits them in that order.
	AdmissionDraw AdmissionMode = "draw"
)

// Admission is a SKU's admission configuration.
type Admission struct {
	Mode AdmissionMode
	// TokenTTL is how long a token holds its units; 0: the SKU's
	// ReservationTTL.
	TokenTTL time.Duration
	// WaitlistMax is the most tickets that may wait at once.
	WaitlistMax int64
	// TokensPerCustomer is the most tokens and waiting tickets one
	// customer may hold of the SKU; 0: no limit.
	TokensPerCustomer int64
	// DrawAt closes a draw's registration (AdmissionDraw only).
	DrawAt time.Time
}

// On reports whether the SKU sells only through tokens.
func (a Admission) On() bool { return a.Mode != AdmissionOff }

// Bounds of admission. Each is far above an honest sale and low enough that
// a hostile configuration cannot make one SKU's waitlist or one customer's
// tickets a burden: a waiting ticket is one row and one position query.
const (
	// WaitlistMaxMax bounds waitlist_max: a million rows of a few hundred
	// bytes each, and the admission worker reads at most
	// admitBatchLen of them per pass however long the list is.
	WaitlistMaxMax = 1_000_000
	// TokensPerCustomerMax bounds tokens_per_customer: an anti-scalping
	// limit above a thousand limits nothing.
	TokensPerCustomerMax = 1_000
)

// ValidateAdmission checks an admission configuration, filling in the token
// TTL from the SKU's reservation TTL when it is unset.
func ValidateAdmission(a *Admission, reservationTTL time.Duration) error {
	switch a.Mode {
	case AdmissionOff:
		*a = Admission{}
		return nil
	case AdmissionTokens:
		if !a.DrawAt.IsZero() {
			return Errorf(CodeInvalidArgument, "admission draw_at is for mode DRAW only")
		}
	case AdmissionDraw:
		if a.DrawAt.IsZero() {
			return Errorf(CodeInvalidArgument, "admission mode DRAW needs draw_at, when registration closes")
		}
	default:
		return Errorf(CodeInvalidArgument, "admission mode %q is unknown", string(a.Mode))
	}
	if a.TokenTTL == 0 {
		a.TokenTTL = reservationTTL
	}
	if a.TokenTTL < ReservationTTLMin || a.TokenTTL > ReservationTTLMax {
		return Errorf(CodeInvalidArgument, "admission token_ttl must be between %s and %s", ReservationTTLMin, ReservationTTLMax)
	}
	if a.WaitlistMax < 0 || a.WaitlistMax > WaitlistMaxMax {
		return Errorf(CodeInvalidArgument, "admission waitlist_max must be between 0 and %d", WaitlistMaxMax)
	}
	if a.TokensPerCustomer < 0 || a.TokensPerCustomer > TokensPerCustomerMax {
		return Errorf(CodeInvalidArgument, "admission tokens_per_customer must be between 0 and %d", TokensPerCustomerMax)
	}
	return nil
}

// SourceAdmission is the ledger source of tokens: reserves the admission
// component takes for a request or a ticket. Only it may reserve a SKU
// under admission.
const SourceAdmission = "admission"

// AdmissionKeyPrefix starts the idempotency key of every token's reserve,
// so that no plain Reserve's key can collide with one (ValidateRequest
// refuses it from any other source).
const AdmissionKeyPrefix = "admission:"

// TicketKey is the idempotency key of the reserve that admits ticket id,
// for a ticket entered before migration 00022 (not Keyed): derived from
// the ticket alone, so that however often an admission is retried (a
// worker that crashed, a lease that moved), the shard applies it once and
// every retry gets the same reservation.
func TicketKey(ticketID string) string {
	h := sha256.Sum256([]byte(ticketID))
	return AdmissionKeyPrefix + hex.EncodeToString(h[:16])
}

// TokenKey is the idempotency key of the reserve that grants a token to
// the RequestToken of sku with key: derived from the request's own key,
// so that the reserve of a token granted directly (no ticket) and the
// reserve that admits the request's ticket, if it got one, are the same
// operation to the shards. However the two race (a retry through another
// allocator, a worker after a crash), the request holds one reservation
// at most, and every attempt gets it back as a replay.
func TokenKey(sku, key string) string {
	h := sha256.New()
	h.Write([]byte("token\x00"))
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(sku))))
	h.Write([]byte(sku))
	h.Write([]byte(key))
	return AdmissionKeyPrefix + hex.EncodeToString(h.Sum(nil)[:16])
}

// ReserveKey is the idempotency key of the reserve that admits t:
// TokenKey of its request for a ticket entered since migration 00022
// (Keyed), else TicketKey of its id.
func (t *Ticket) ReserveKey() string {
	if t.Keyed {
		return TokenKey(t.SKU, t.IdempotencyKey)
	}
	return TicketKey(t.ID)
}

// Direct reports whether a's SKU grants a token to a request directly,
// with no ticket, when units are free and no ticket is queued: first come,
// first served without tokens_per_customer, which counts tickets under
// the SKU's lock (docs/admission.md, "Direct grants").
func (a Admission) Direct() bool { return a.Mode == AdmissionTokens && a.TokensPerCustomer == 0 }

// IsAdmissionKey reports whether key names a token's reserve.
func IsAdmissionKey(key string) bool { return strings.HasPrefix(key, AdmissionKeyPrefix) }

// TicketState is where a request for a token is.
type TicketState string

const (
	// TicketPending: the request is being served now (a reserve in
	// flight); not in the waitlist yet.
	TicketPending TicketState = "pending"
	TicketWaiting TicketState = "waiting"
	// TicketAdmitted: the ticket holds a token (its reservation).
	TicketAdmitted  TicketState = "admitted"
	TicketSoldOut   TicketState = "sold_out"
	TicketCancelled TicketState = "cancelled"
	// TicketRegistered: entered in a draw that has not run yet; it holds
	// nothing. The draw makes it WAITING, in drawn order.
	TicketRegistered TicketState = "registered"
	// TicketLost: drawn, never admitted, and the SKU sold out for good.
	TicketLost TicketState = "lost"
)

// Ticket is one request for a token, in the SKU's order of arrival. A
// request answered with a token at once is a ticket admitted at once.
type Ticket struct {
	ID             string
	Seq            int64 // order of arrival within the database
	SKU            string
	Quantity       int64
	IdempotencyKey string
	CustomerRef    string
	State          TicketState
	// Position is the tickets waiting before this one (WAITING only).
	Position int64
	// TokenID and ExpiresAt are the token's, once admitted.
	TokenID   string
	ExpiresAt time.Time
	CreatedAt time.Time
	// Direct: admitted by its own request, not from the waitlist.
	Direct bool
	// Rank is the ticket's place in its SKU's draw, from 1; 0 before the
	// draw and for a SKU without one.
	Rank int64
	// Keyed: its reserve's key is TokenKey of its request (ReserveKey).
	Keyed bool
}

// TicketEntry is one request for a token in a batch of entries
// (admission's EnterTickets): the ticket asked for (SKU, Quantity,
// IdempotencyKey, CustomerRef) and the hash of what its key was first used
// for (IDEMPOTENCY_KEY_REUSED when it differs).
type TicketEntry struct {
	Ticket Ticket
	Params []byte
	// Direct: the request may take its token directly, with no ticket,
	// if no ticket is queued (Admission.Direct, and not a request whose
	// direct reserve was just refused for stock).
	Direct bool
}

// TicketEntered is a TicketEntry's outcome: the ticket recorded, or the
// one its key recorded before (Replayed), or the request's refusal (Err,
// a *Error; nothing recorded).
type TicketEntered struct {
	Ticket   *Ticket
	Replayed bool
	Err      error
	// Direct: nothing recorded; the request reserves its token directly.
	Direct bool
}

// EntryRoute decides, in an entry batch before the SKU's lock, which of
// the entries whose key has no ticket (fresh, indexes into entries) take
// none: it answers those in out and returns the others, to be entered.
// counts are the SKU's, read with the keys. An answer of a token found by
// its key (a ticket with no id) is replaced by the key's ticket when the
// key has one.
type EntryRoute func(ctx context.Context, counts EntryCounts, entries []TicketEntry, fresh []int, out []TicketEntered) []int

// EntryCounts is what an entry batch reads of its SKU with its keys,
// before the lock.
type EntryCounts struct {
	// Queued is the SKU's tickets queued (waiting, or claimed).
	Queued int64
	// Ticketed: the SKU has had a ticket, or its first is being entered.
	// Read false, no ticket of the SKU exists until DirectTrustMax after
	// ReadAt (the direct grants' trust).
	Ticketed bool
	// ReadAt is when the read began (this process's monotonic clock).
	ReadAt time.Time
}

// A read that found a SKU never ticketed (no admission_counts row) is
// trusted for DirectTrustMax after the read began: a SKU's first ticket is
// entered only once DirectTrustMax and DirectTrustMargin (for the clocks'
// rates and the row's commit) have passed since its row was committed
// (docs/admission.md, "Direct grants").
const (
	DirectTrustMax    = 100 * time.Millisecond
	DirectTrustMargin = 50 * time.Millisecond
)

// TicketMark is the mark of one ticket admitted with a token (a
// reservation taken with its ReserveKey), in a batch of marks.
type TicketMark struct {
	ID        string
	TokenID   string
	ExpiresAt time.Time
	Direct    bool
}

// DrawState is where a SKU's draw is.
type DrawState string

const (
	// DrawRegistering: before draw_at, or after it until the worker has
	// recorded the seed.
	DrawRegistering DrawState = "registering"
	// DrawSeeded: the seed is recorded; the order is not yet. A worker
	// that takes over finishes the draw with this seed.
	DrawSeeded DrawState = "seeded"
	// DrawDrawn: the order is recorded (every ticket's rank).
	DrawDrawn DrawState = "drawn"
)

// Draw is a SKU's draw as GetDraw shows it: enough to replay it
// (admission.DrawOrder(Seed, the ticket ids) is Tickets).
type Draw struct {
	SKU     string
	State   DrawState
	DrawAt  time.Time
	Seed    []byte
	DrawnAt time.Time
	// Total is the tickets drawn; Tickets is a page of them in drawn
	// order, from rank After+1.
	Total   int64
	Tickets []string
	// Winners is the drawn tickets admitted with a token so far.
	Winners int64
}

// Waitlist is a SKU's admission counts, for GetStock.
type Waitlist struct {
	Waiting int64
}
