package stock

import (
	"errors"
	"fmt"
	"slices"
)

// Code is the reason of an error, as carried in the public API's
// google.rpc.ErrorInfo detail. The transport maps each code to its Connect
// code in one table (internal/wire).
type Code string

// Error codes of the public API.
const (
	// invalid_argument
	CodeInvalidSKU               Code = "INVALID_SKU"
	CodeInvalidQuantity          Code = "INVALID_QUANTITY"
	CodeInvalidIdempotencyKey    Code = "INVALID_IDEMPOTENCY_KEY"
	CodeQuantityAboveMaxPerOrder Code = "QUANTITY_ABOVE_MAX_PER_ORDER"
	CodeIdempotencyKeyReused     Code = "IDEMPOTENCY_KEY_REUSED"
	CodeInvalidArgument          Code = "INVALID_ARGUMENT"
	// CodeCustomerRefRequired: a reserve or deduct without customer_ref on
	// a SKU with a customer_limit.
	CodeCustomerRefRequired Code = "CUSTOMER_REF_REQUIRED"
	// not_found
	CodeSKUNotFound         Code = "SKU_NOT_FOUND"
	CodeReservationNotFound Code = "RESERVATION_NOT_FOUND"
	CodeOperationNotFound   Code = "OPERATION_NOT_FOUND"
	// CodeSaleNotFound: a refund's original is no sale of the SKU (no
	// deduct with that key, no committed reservation with that id).
	CodeSaleNotFound Code = "SALE_NOT_FOUND"
	// CodeOrderNotFound: no order with that id or key.
	CodeOrderNotFound Code = "ORDER_NOT_FOUND"
	// CodeTicketNotFound: no ticket with that id, or sku and key.
	CodeTicketNotFound Code = "TICKET_NOT_FOUND"
	// failed_precondition
	CodeOutOfStock                  Code = "OUT_OF_STOCK"
	CodeSKUPaused                   Code = "SKU_PAUSED"
	CodeReservationExpired          Code = "RESERVATION_EXPIRED"
	CodeReservationAlreadyCommitted Code = "RESERVATION_ALREADY_COMMITTED"
	CodeReservationAlreadyReleased  Code = "RESERVATION_ALREADY_RELEASED"
	CodeCustomerLimitReached        Code = "CUSTOMER_LIMIT_REACHED"
	// CodeHoldLimitReached: ExtendReservation would hold a reservation
	// past its SKU's max_hold from when it was made.
	CodeHoldLimitReached Code = "HOLD_LIMIT_REACHED"
	// CodeOrderAlreadyApplied: the SKU applies an order_ref once per kind,
	// and another key applied it already (the message names that key).
	CodeOrderAlreadyApplied Code = "ORDER_ALREADY_APPLIED"
	// CodeOrderFailed: the order ended failed, nothing of it held, for a
	// cause whose own code would not say so (a recovery failed it after its
	// driver stopped, or a line's answer stayed unknown): a new attempt
	// needs a new key. ErrorInfo metadata `cause` keeps that code.
	CodeOrderFailed Code = "ORDER_FAILED"
	// CodeRefundExceedsSale: a refund would return more than its sale sold,
	// counting the refunds of it before.
	CodeRefundExceedsSale Code = "REFUND_EXCEEDS_SALE"
	CodeSKUExists         Code = "SKU_ALREADY_EXISTS"
	CodeShardNotHalted    Code = "SHARD_NOT_HALTED"
	// CodeShardsRetiring: SetShards asked to shrink a SKU whose shards of
	// an earlier shrink are still being retired (they hold reservations or
	// stock); retry once GetStock lists them no more.
	CodeShardsRetiring Code = "SHARDS_RETIRING"
	// CodeSaleNotStarted: the SKU's sale window has not opened yet (the
	// start is in the ErrorInfo metadata, sale_start). CodeSaleEnded: it
	// has closed (sale_end).
	CodeSaleNotStarted Code = "SALE_NOT_STARTED"
	CodeSaleEnded      Code = "SALE_ENDED"
	// CodeTokenRequired: a plain Reserve or Deduct of a SKU under
	// admission, which sells only through tokens (RequestToken).
	CodeTokenRequired Code = "TOKEN_REQUIRED"
	// CodeWaitlistFull: no unit is free and the SKU's waitlist holds its
	// waitlist_max tickets.
	CodeWaitlistFull Code = "WAITLIST_FULL"
	// aborted
	CodeOperationInProgress Code = "OPERATION_IN_PROGRESS"
	// CodeRebalanceInProgress: another allocator holds the SKU's rebalance
	// lease; retry later.
	CodeRebalanceInProgress Code = "REBALANCE_IN_PROGRESS"
	// CodeMoveFenced: a transfer's mover no longer holds the SKU's lease (a
	// newer one took over); the transfer is refused or aborted.
	CodeMoveFenced Code = "MOVE_FENCED"
	// CodePlacementFull: SetPlacement would keep more than
	// PlacementVersionsMax versions of the placement.
	CodePlacementFull Code = "PLACEMENT_FULL"
	// unavailable: retry with the same key is safe
	CodeShardUnavailable Code = "SHARD_UNAVAILABLE"
	// resource_exhausted
	CodeRateLimited Code = "RATE_LIMITED"
	// CodeConsumerBehind: a change stream's consumer receives too slowly to
	// be streamed to; it resumes from the last cursor it received.
	CodeConsumerBehind Code = "CONSUMER_BEHIND"
	// unauthenticated / permission_denied
	CodeUnauthenticated  Code = "UNAUTHENTICATED"
	CodePermissionDenied Code = "PERMISSION_DENIED"
	// internal: a bug or an invariant violation; never leaks details
	CodeInternal Code = "INTERNAL"
	// unimplemented: a call this server does not serve (yet)
	CodeUnimplemented Code = "UNIMPLEMENTED"
)

// Codes are the error codes of the public API, in the order declared
// above; TestCodes_Listed fails on a code declared and not listed.
var Codes = []Code{
	CodeInvalidSKU, CodeInvalidQuantity, CodeInvalidIdempotencyKey, CodeQuantityAboveMaxPerOrder,
	CodeIdempotencyKeyReused, CodeInvalidArgument, CodeCustomerRefRequired,
	CodeSKUNotFound, CodeReservationNotFound, CodeOperationNotFound, CodeSaleNotFound, CodeOrderNotFound, CodeTicketNotFound,
	CodeOutOfStock, CodeSKUPaused, CodeReservationExpired, CodeReservationAlreadyCommitted,
	CodeReservationAlreadyReleased, CodeCustomerLimitReached, CodeHoldLimitReached, CodeOrderAlreadyApplied, CodeOrderFailed,
	CodeRefundExceedsSale, CodeSKUExists, CodeShardNotHalted,
	CodeShardsRetiring, CodeSaleNotStarted, CodeSaleEnded, CodeTokenRequired, CodeWaitlistFull,
	CodeOperationInProgress, CodeRebalanceInProgress, CodeMoveFenced, CodePlacementFull,
	CodeShardUnavailable,
	CodeRateLimited, CodeConsumerBehind,
	CodeUnauthenticated, CodePermissionDenied,
	CodeInternal,
	CodeUnimplemented,
}

// Error is a domain error with a code and a message safe to show a client.
type Error struct {
	Code    Code
	Message string
	// Metadata is the ErrorInfo metadata: facts a client acts on (e.g.
	// SALE_NOT_STARTED's sale_start, an order's refused line's "sku"); nil
	// for most codes.
	Metadata map[string]string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of err, or CodeInternal when err carries none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// Retryable reports whether the same request may be retried with the same
// key: the operation did not happen, or its outcome can be looked up.
func (c Code) Retryable() bool {
	return c == CodeShardUnavailable || c == CodeOperationInProgress || c == CodeRateLimited
}

// Definite reports whether an error with code c says for certain what
// became of its request: that it changed nothing. Every code of Codes
// does but three, whose request may have been applied: INTERNAL (a bug, or
// a commit whose answer was lost), SHARD_UNAVAILABLE and
// OPERATION_IN_PROGRESS (look the operation up, or send it again with the
// same key). A code that is not the API's (a transport's) is not definite.
// A definite code may still be Retryable (RATE_LIMITED).
func (c Code) Definite() bool {
	switch c {
	case CodeInternal, CodeShardUnavailable, CodeOperationInProgress:
		return false
	}
	return slices.Contains(Codes, c)
}
