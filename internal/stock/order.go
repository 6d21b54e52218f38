package stock

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
	"time"
)

// OrderLinesMax bounds an order's lines: a cart, not a warehouse.
const OrderLinesMax = 50

// OrderLineKeyPrefix starts the idempotency key of every order line's
// reservation (OrderLineKey); a client's Reserve or Deduct may not use it,
// and a client's Commit, Release or ExtendReservation of such a
// reservation is refused: an order's lines end with the order.
const OrderLineKeyPrefix = "order-line:"

// SourceOrder is the ledger source of an order's lines, taken and ended
// by the order's driver or its recovery.
const SourceOrder = "order"

// OrderState is where an order is. It ends once, as a whole: committed,
// released or failed.
type OrderState string

const (
	// OrderPending: its lines are being held, or undone after its driver died.
	OrderPending OrderState = "pending"
	// OrderHeld: every line is held.
	OrderHeld       OrderState = "held"
	OrderCommitting OrderState = "committing"
	OrderCommitted  OrderState = "committed"
	OrderReleasing  OrderState = "releasing"
	OrderReleased   OrderState = "released"
	// OrderFailed: a line could not be held, and none is.
	OrderFailed OrderState = "failed"
)

// Open reports whether an order's driver is still at work on it: a
// recovery finishes (committing, releasing) or undoes (pending) an open
// order whose driver's lease ran out.
func (s OrderState) Open() bool {
	return s == OrderPending || s == OrderCommitting || s == OrderReleasing
}

// OrderLine is one SKU of an order and, once held, its reservation.
type OrderLine struct {
	SKU           string `json:"sku"`
	Quantity      int64  `json:"quantity"`
	ReservationID string `json:"reservation_id,omitempty"`
}

// Order is a cart whose lines are held all or nothing.
type Order struct {
	ID             string
	IdempotencyKey string
	OrderRef       string
	CustomerRef    string
	TTL            time.Duration
	State          OrderState
	Lines          []OrderLine // by SKU
	ExpiresAt      time.Time   // the earliest line's, once held
	// Reason is why it failed (the refusal's code and message) or was
	// released.
	Reason string
	// FailCode is the code of the refusal that failed it.
	FailCode  Code
	FailSKU   string
	CreatedAt time.Time
	// Caller placed the order (stock.Request.Caller): every line's ledger
	// entries name it, those its recovery writes too.
	Caller string
}

// NewOrderID returns a fresh order id.
func NewOrderID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("stock: crypto/rand: " + err.Error())
	}
	return "o1." + hex.EncodeToString(b[:])
}

// OrderLineKey is the idempotency key of an order's line: derived from
// the order and the SKU, so that a retry, a second driver and a recovery
// all name the same reservation, and it is held at most once.
func OrderLineKey(orderID, sku string) string {
	h := sha256.Sum256([]byte(orderID + "\x00" + sku))
	return OrderLineKeyPrefix + hex.EncodeToString(h[:16])
}

// IsOrderLineKey reports whether key is an order line's.
func IsOrderLineKey(key string) bool { return strings.HasPrefix(key, OrderLineKeyPrefix) }

// PrepareOrder validates a new order and sorts its lines by SKU: the fixed
// order in which every driver takes them, so that two carts that share
// SKUs never wait on each other in a cycle. Quantities are each at most
// QuantityMax and lines at most OrderLinesMax, so no sum can overflow.
func PrepareOrder(o *Order) error {
	if err := ValidateKey(o.IdempotencyKey); err != nil {
		return err
	}
	if err := ValidateText("order_ref", o.OrderRef, RefLenMax); err != nil {
		return err
	}
	if err := ValidateText("customer_ref", o.CustomerRef, RefLenMax); err != nil {
		return err
	}
	if err := ValidateTTL(o.TTL); err != nil {
		return err
	}
	if len(o.Lines) == 0 || len(o.Lines) > OrderLinesMax {
		return Errorf(CodeInvalidArgument, "an order has 1 to %d lines, got %d", OrderLinesMax, len(o.Lines))
	}
	slices.SortFunc(o.Lines, func(a, b OrderLine) int { return strings.Compare(a.SKU, b.SKU) })
	for i := range o.Lines {
		l := &o.Lines[i]
		l.ReservationID = ""
		if err := ValidateSKU(l.SKU); err != nil {
			return err
		}
		if err := ValidateQuantity(l.Quantity); err != nil {
			return err
		}
		if i > 0 && o.Lines[i-1].SKU == l.SKU {
			return Errorf(CodeInvalidArgument, "sku %q is on two lines", l.SKU)
		}
	}
	return nil
}

// OrderHash is the hash of an order's parameters: a retry with the same
// key must carry the same, or it is IDEMPOTENCY_KEY_REUSED.
func OrderHash(o *Order) []byte {
	h := sha256.New()
	var n [8]byte
	field := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(o.OrderRef)
	field(o.CustomerRef)
	for _, l := range o.Lines {
		field(l.SKU)
		binary.BigEndian.PutUint64(n[:], uint64(l.Quantity))
		h.Write(n[:])
	}
	return h.Sum(nil)
}
