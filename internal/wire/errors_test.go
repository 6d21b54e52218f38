package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/shardstock/shardstock/internal/stock"
)

// domainCodes is every domain code with the Connect code it maps to: the
// table clients rely on, written out again here so that a change to
// connectCodes shows as a failure.
var domainCodes = []struct {
	code stock.Code
	want connect.Code
}{
	{stock.CodeInvalidSKU, connect.CodeInvalidArgument},
	{stock.CodeInvalidQuantity, connect.CodeInvalidArgument},
	{stock.CodeInvalidIdempotencyKey, connect.CodeInvalidArgument},
	{stock.CodeQuantityAboveMaxPerOrder, connect.CodeInvalidArgument},
	{stock.CodeIdempotencyKeyReused, connect.CodeInvalidArgument},
	{stock.CodeInvalidArgument, connect.CodeInvalidArgument},
	{stock.CodeCustomerRefRequired, connect.CodeInvalidArgument},
	{stock.CodeSKUNotFound, connect.CodeNotFound},
	{stock.CodeReservationNotFound, connect.CodeNotFound},
	{stock.CodeOperationNotFound, connect.CodeNotFound},
	{stock.CodeOutOfStock, connect.CodeFailedPrecondition},
	{stock.CodeSKUPaused, connect.CodeFailedPrecondition},
	{stock.CodeReservationExpired, connect.CodeFailedPrecondition},
	{stock.CodeReservationAlreadyCommitted, connect.CodeFailedPrecondition},
	{stock.CodeReservationAlreadyReleased, connect.CodeFailedPrecondition},
	{stock.CodeCustomerLimitReached, connect.CodeFailedPrecondition},
	{stock.CodeHoldLimitReached, connect.CodeFailedPrecondition},
	{stock.CodeOrderAlreadyApplied, connect.CodeFailedPrecondition},
	{stock.CodeOrderFailed, connect.CodeFailedPrecondition},
	{stock.CodeRefundExceedsSale, connect.CodeFailedPrecondition},
	{stock.CodeSaleNotFound, connect.CodeNotFound},
	{stock.CodeOrderNotFound, connect.CodeNotFound},
	{stock.CodeSKUExists, connect.CodeAlreadyExists},
	{stock.CodeShardNotHalted, connect.CodeFailedPrecondition},
	{stock.CodeShardsRetiring, connect.CodeFailedPrecondition},
	{stock.CodeSaleNotStarted, connect.CodeFailedPrecondition},
	{stock.CodeSaleEnded, connect.CodeFailedPrecondition},
	{stock.CodeTicketNotFound, connect.CodeNotFound},
	{stock.CodeTokenRequired, connect.CodeFailedPrecondition},
	{stock.CodeWaitlistFull, connect.CodeFailedPrecondition},
	{stock.CodeOperationInProgress, connect.CodeAborted},
	{stock.CodeRebalanceInProgress, connect.CodeAborted},
	{stock.CodeMoveFenced, connect.CodeAborted},
	{stock.CodePlacementFull, connect.CodeFailedPrecondition},
	{stock.CodeShardUnavailable, connect.CodeUnavailable},
	{stock.CodeRateLimited, connect.CodeResourceExhausted},
	{stock.CodeConsumerBehind, connect.CodeResourceExhausted},
	{stock.CodeUnauthenticated, connect.CodeUnauthenticated},
	{stock.CodePermissionDenied, connect.CodePermissionDenied},
	{stock.CodeInternal, connect.CodeInternal},
	{stock.CodeUnimplemented, connect.CodeUnimplemented},
}

// errorInfo returns the shardstock ErrorInfo of a Connect error, or nil.
func errorInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%v is not a Connect error", err)
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			t.Fatalf("detail of %v: %v", err, derr)
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func TestToConnect_DomainCodes(t *testing.T) {
	if len(domainCodes) != len(connectCodes) {
		t.Errorf("the test names %d domain codes, connectCodes maps %d: add the new ones to both", len(domainCodes), len(connectCodes))
	}
	for _, tc := range domainCodes {
		t.Run(string(tc.code), func(t *testing.T) {
			for _, err := range []error{
				stock.Errorf(tc.code, "what happened"),
				fmt.Errorf("wrapped: %w", stock.Errorf(tc.code, "what happened")),
			} {
				got := ToConnect(err)
				if c := connect.CodeOf(got); c != tc.want {
					t.Errorf("ToConnect(%v) has code %v, want %v", err, c, tc.want)
				}
				info := errorInfo(t, got)
				if info == nil || info.Reason != string(tc.code) || info.Domain != ErrorDomain {
					t.Errorf("ToConnect(%v) has ErrorInfo %v, want reason %s in domain %s", err, info, tc.code, ErrorDomain)
				}
				var ce *connect.Error
				if errors.As(got, &ce); ce.Message() != "what happened" {
					t.Errorf("ToConnect(%v) has message %q, want %q", err, ce.Message(), "what happened")
				}
				if r := Reason(got); r != string(tc.code) {
					t.Errorf("Reason(ToConnect(%v)) = %q, want %q", err, r, tc.code)
				}
				if back := FromConnect(got); back.Code != tc.code || back.Message != "what happened" {
					t.Errorf("FromConnect(ToConnect(%v)) = %v, want %s: what happened", err, back, tc.code)
				}
			}
			if c := ConnectCode(tc.code); c != tc.want {
				t.Errorf("ConnectCode(%s) = %v, want %v", tc.code, c, tc.want)
			}
		})
	}
}

// An error's metadata travels in its ErrorInfo and back: SALE_NOT_STARTED
// tells the client when the sale starts, across the shard server's
// Execute too.
func TestToConnect_Metadata(t *testing.T) {
	e := stock.Errorf(stock.CodeSaleNotStarted, "not yet")
	e.Metadata = map[string]string{stock.MetaSaleStart: "2026-12-24T18:00:00Z"}
	if info := errorInfo(t, ToConnect(e)); info.GetMetadata()[stock.MetaSaleStart] != "2026-12-24T18:00:00Z" {
		t.Errorf("ToConnect(%v) has ErrorInfo metadata %v, want sale_start", e, info.GetMetadata())
	}
	if back := FromConnect(ToConnect(e)); back.Metadata[stock.MetaSaleStart] != "2026-12-24T18:00:00Z" {
		t.Errorf("FromConnect(ToConnect(%v)) has metadata %v, want sale_start", e, back.Metadata)
	}
	if back := ResultFromProto(ResultToProto(stock.Result{Err: e})); back.Err.Metadata[stock.MetaSaleStart] != "2026-12-24T18:00:00Z" {
		t.Errorf("a shard result of %v has metadata %v after the wire, want sale_start", e, back.Err.Metadata)
	}
}

func TestToConnect_Other(t *testing.T) {
	secret := errors.New(`ERROR: relation "shards" violates check constraint (SQLSTATE 23514) at 10.0.0.7:5432`)
	passed := connect.NewError(connect.CodeNotFound, errors.New("as it was"))
	for _, tc := range []struct {
		name       string
		err        error
		wantCode   connect.Code
		wantReason string
		wantMsg    string
	}{
		{"NoDomainCode", secret, connect.CodeInternal, string(stock.CodeInternal), "internal error"},
		{"WrappedNoDomainCode", fmt.Errorf("reserve: %w", secret), connect.CodeInternal, string(stock.CodeInternal), "internal error"},
		{"Deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), connect.CodeUnavailable, string(stock.CodeShardUnavailable), "deadline exceeded; retry with the same key or look it up"},
		{"Canceled", context.Canceled, connect.CodeCanceled, "", "request canceled"},
		{"ConnectError", passed, connect.CodeNotFound, "", "as it was"},
		{"UnknownDomainCode", stock.Errorf("NO_SUCH_CODE", "odd"), connect.CodeInternal, "NO_SUCH_CODE", "odd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ToConnect(tc.err)
			var ce *connect.Error
			if !errors.As(got, &ce) {
				t.Fatalf("ToConnect(%v) = %v, want a Connect error", tc.err, got)
			}
			if ce.Code() != tc.wantCode || Reason(got) != tc.wantReason || ce.Message() != tc.wantMsg {
				t.Errorf("ToConnect(%v) = %v (reason %q, message %q), want %v (reason %q, message %q)",
					tc.err, ce.Code(), Reason(got), ce.Message(), tc.wantCode, tc.wantReason, tc.wantMsg)
			}
			if strings.Contains(got.Error(), "SQLSTATE") || strings.Contains(got.Error(), "10.0.0.7") {
				t.Errorf("ToConnect(%v) = %v, which leaks the cause", tc.err, got)
			}
		})
	}
	if got := ToConnect(nil); got != nil {
		t.Errorf("ToConnect(nil) = %v, want nil", got)
	}
}

func TestFromConnect_NoErrorInfo(t *testing.T) {
	foreign := connect.NewError(connect.CodeNotFound, errors.New("elsewhere"))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "OUT_OF_STOCK", Domain: "example.com"}); err == nil {
		foreign.AddDetail(d)
	}
	for _, tc := range []struct {
		name string
		err  error
		want stock.Code
	}{
		{"NotConnect", errors.New("dial tcp: connection refused"), stock.CodeShardUnavailable},
		{"Unavailable", connect.NewError(connect.CodeUnavailable, nil), stock.CodeShardUnavailable},
		{"DeadlineExceeded", connect.NewError(connect.CodeDeadlineExceeded, nil), stock.CodeShardUnavailable},
		{"Canceled", connect.NewError(connect.CodeCanceled, nil), stock.CodeShardUnavailable},
		{"Unknown", connect.NewError(connect.CodeUnknown, nil), stock.CodeShardUnavailable},
		{"Unauthenticated", connect.NewError(connect.CodeUnauthenticated, errors.New("no token")), stock.CodeUnauthenticated},
		{"Internal", connect.NewError(connect.CodeInternal, nil), stock.CodeInternal},
		{"OtherDomain", foreign, stock.CodeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromConnect(tc.err); got == nil || got.Code != tc.want {
				t.Errorf("FromConnect(%v) = %v, want %s", tc.err, got, tc.want)
			}
		})
	}
	if got := FromConnect(nil); got != nil {
		t.Errorf("FromConnect(nil) = %v, want nil", got)
	}
	if got := Reason(errors.New("plain")); got != "" {
		t.Errorf("Reason(plain error) = %q, want \"\"", got)
	}
}

// TestReason_FromWire: a Connect error as a client decodes it carries its
// reason in the ErrorInfo detail only, and Reason reads it there.
func TestReason_FromWire(t *testing.T) {
	ce := connect.NewError(connect.CodeFailedPrecondition, errors.New("sold out"))
	detail, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: string(stock.CodeOutOfStock), Domain: ErrorDomain})
	if err != nil {
		t.Fatal(err)
	}
	ce.AddDetail(detail)
	if got := Reason(ce); got != string(stock.CodeOutOfStock) {
		t.Errorf("Reason(%v) = %q, want %s", ce, got, stock.CodeOutOfStock)
	}
}

// BenchmarkReason: the reason of a refusal, as the call metrics read it
// on every call.
func BenchmarkReason(b *testing.B) {
	err := ToConnect(stock.Errorf(stock.CodeOutOfStock, "sku %q is sold out", "hot"))
	for b.Loop() {
		if Reason(err) != string(stock.CodeOutOfStock) {
			b.Fatal("wrong reason")
		}
	}
}
