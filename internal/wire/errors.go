// Package wire maps shardstock's domain to what travels on the wire and
// back: the conversions between internal/stock and the protobuf messages,
// and the one table that maps domain error codes to Connect codes and
// reasons. The handlers are in internal/api; the HTTP/2 servers and clients
// that carry them are in internal/transport.
package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/shardstock/shardstock/internal/stock"
)

// ErrorDomain is the ErrorInfo domain of every shardstock error.
const ErrorDomain = "shardstock"

// connectCodes is the one map from domain code to Connect code.
var connectCodes = map[stock.Code]connect.Code{
	stock.CodeInvalidSKU:                  connect.CodeInvalidArgument,
	stock.CodeInvalidQuantity:             connect.CodeInvalidArgument,
	stock.CodeInvalidIdempotencyKey:       connect.CodeInvalidArgument,
	stock.CodeQuantityAboveMaxPerOrder:    connect.CodeInvalidArgument,
	stock.CodeIdempotencyKeyReused:        connect.CodeInvalidArgument,
	stock.CodeInvalidArgument:             connect.CodeInvalidArgument,
	stock.CodeCustomerRefRequired:         connect.CodeInvalidArgument,
	stock.CodeSKUNotFound:                 connect.CodeNotFound,
	stock.CodeReservationNotFound:         connect.CodeNotFound,
	stock.CodeOperationNotFound:           connect.CodeNotFound,
	stock.CodeOutOfStock:                  connect.CodeFailedPrecondition,
	stock.CodeSKUPaused:                   connect.CodeFailedPrecondition,
	stock.CodeReservationExpired:          connect.CodeFailedPrecondition,
	stock.CodeReservationAlreadyCommitted: connect.CodeFailedPrecondition,
	stock.CodeReservationAlreadyReleased:  connect.CodeFailedPrecondition,
	stock.CodeCustomerLimitReached:        connect.CodeFailedPrecondition,
	stock.CodeHoldLimitReached:            connect.CodeFailedPrecondition,
	stock.CodeOrderAlreadyApplied:         connect.CodeFailedPrecondition,
	stock.CodeOrderFailed:                 connect.CodeFailedPrecondition,
	stock.CodeRefundExceedsSale:           connect.CodeFailedPrecondition,
	stock.CodeSaleNotFound:                connect.CodeNotFound,
	stock.CodeOrderNotFound:               connect.CodeNotFound,
	stock.CodeTicketNotFound:              connect.CodeNotFound,
	stock.CodeTokenRequired:               connect.CodeFailedPrecondition,
	stock.CodeWaitlistFull:                connect.CodeFailedPrecondition,
	stock.CodeSKUExists:                   connect.CodeAlreadyExists,
	stock.CodeShardNotHalted:              connect.CodeFailedPrecondition,
	stock.CodeShardsRetiring:              connect.CodeFailedPrecondition,
	stock.CodeSaleNotStarted:              connect.CodeFailedPrecondition,
	stock.CodeSaleEnded:                   connect.CodeFailedPrecondition,
	stock.CodeOperationInProgress:         connect.CodeAborted,
	stock.CodeRebalanceInProgress:         connect.CodeAborted,
	stock.CodeMoveFenced:                  connect.CodeAborted,
	stock.CodePlacementFull:               connect.CodeFailedPrecondition,
	stock.CodeShardUnavailable:            connect.CodeUnavailable,
	stock.CodeRateLimited:                 connect.CodeResourceExhausted,
	stock.CodeConsumerBehind:              connect.CodeResourceExhausted,
	stock.CodeUnauthenticated:             connect.CodeUnauthenticated,
	stock.CodePermissionDenied:            connect.CodePermissionDenied,
	stock.CodeInternal:                    connect.CodeInternal,
	stock.CodeUnimplemented:               connect.CodeUnimplemented,
}

// ConnectCode returns the Connect code of a domain code.
func ConnectCode(c stock.Code) connect.Code {
	if cc, ok := connectCodes[c]; ok {
		return cc
	}
	return connect.CodeInternal
}

// ToConnect turns an error into a Connect error with a google.rpc.ErrorInfo
// detail whose reason is the domain code. An error without a domain code
// becomes INTERNAL with a fixed message: no SQL or internals leak.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	var e *stock.Error
	if !errors.As(err, &e) {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			e = stock.Errorf(stock.CodeShardUnavailable, "deadline exceeded; retry with the same key or look it up")
		case errors.Is(err, context.Canceled):
			return connect.NewError(connect.CodeCanceled, errors.New("request canceled"))
		case unreachable(err):
			e = stock.Errorf(stock.CodeShardUnavailable, "a database did not answer; retry with the same key or look it up")
		default:
			e = stock.Errorf(stock.CodeInternal, "internal error")
		}
	}
	cerr := connect.NewError(ConnectCode(e.Code), &reasoned{msg: e.Message, code: e.Code})
	if detail, derr := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: string(e.Code), Domain: ErrorDomain, Metadata: e.Metadata}); derr == nil {
		cerr.AddDetail(detail)
	}
	return cerr
}

// unreachable reports whether err says that a database did not answer
// (the connection refused, broken or timed out, the server shutting down
// or full) or asked for the transaction to be tried again, rather than a
// fault of the call's own. Every call of the API is safe to send again
// with the same key, so such an error is SHARD_UNAVAILABLE, which clients
// retry, not INTERNAL, which they must not. pgconn's errors are matched by
// their methods (a PgError's SQLState, a lock error's SafeToRetry), so
// that this package needs no database driver.
func unreachable(err error) bool {
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		code := state.SQLState()
		switch code {
		case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
			"53300",          // too_many_connections
			"40001", "40P01", // serialization_failure, deadlock_detected
			"57014": // query_canceled (a statement timeout)
			return true
		}
		return strings.HasPrefix(code, "08") // connection_exception
	}
	var netErr net.Error
	var retry interface{ SafeToRetry() bool }
	switch {
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &retry):
		return retry.SafeToRetry()
	}
	return false
}

// FromConnect recovers the domain error of a Connect error: its ErrorInfo
// reason when it has one, else a code that fits the Connect code.
func FromConnect(err error) *stock.Error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return stock.Errorf(stock.CodeShardUnavailable, "shard server unreachable")
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
			return &stock.Error{Code: stock.Code(info.Reason), Message: ce.Message(), Metadata: info.GetMetadata()}
		}
	}
	switch ce.Code() {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeCanceled, connect.CodeUnknown:
		return stock.Errorf(stock.CodeShardUnavailable, "shard server unavailable: %s", ce.Code())
	case connect.CodeUnauthenticated:
		return stock.Errorf(stock.CodeUnauthenticated, "%s", ce.Message())
	}
	return stock.Errorf(stock.CodeInternal, "shard server error: %s", ce.Code())
}

// reasoned is the message of a Connect error ToConnect made, with the
// domain code its ErrorInfo carries, so that Reason, on every call's path
// (the call metrics), need not decode and copy the detail.
type reasoned struct {
	msg  string
	code stock.Code
}

func (r *reasoned) Error() string { return r.msg }

// Reason returns the ErrorInfo reason of a Connect error, or "".
func Reason(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	if r, ok := ce.Unwrap().(*reasoned); ok {
		return string(r.code)
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.Reason
			}
		}
	}
	return ""
}
