package stock

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// publicCode reports whether err is a domain error with a code that the
// API documents for bad input (never INTERNAL: bad input must not look like
// a bug).
func publicCode(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case CodeInvalidArgument, CodeInvalidSKU, CodeInvalidQuantity, CodeInvalidIdempotencyKey, CodeReservationNotFound:
		return true
	}
	return false
}

// Reservation tokens from clients are untrusted: any string either parses
// to a valid shard, whose fresh token parses back to it, or is refused with
// a documented code; nothing panics.
func FuzzParseReservationID(f *testing.F) {
	f.Add(NewReservationID(ShardKey{SKU: "tshirt-red-m", Index: 3}))
	f.Add("r1.dHNoaXJ0.0.000000000000000000000000")
	f.Add("r1..0.")
	f.Add("r1.%%%.1.zz")
	f.Add("")
	f.Add(strings.Repeat("r1.", 100))
	f.Fuzz(func(t *testing.T, id string) {
		k, err := ParseReservationID(id)
		if err != nil {
			if !publicCode(err) {
				t.Fatalf("ParseReservationID(%q) = %v, want a documented code", id, err)
			}
			return
		}
		if ValidateSKU(k.SKU) != nil || k.Index < 0 || k.Index >= ShardsMax {
			t.Fatalf("ParseReservationID(%q) = %+v, an invalid shard", id, k)
		}
		if back, err := ParseReservationID(NewReservationID(k)); err != nil || back != k {
			t.Fatalf("a fresh token of %+v parses to %+v, %v", k, back, err)
		}
	})
}

// Any request either validates, and then holds what the writers rely on
// (a valid SKU and shard, a valid key and quantity for its kind, texts
// within their bounds, UTF-8 without control characters), or is refused
// with a documented code; nothing panics.
func FuzzValidateRequest(f *testing.F) {
	f.Add(uint8(0), "tshirt-red-m", int32(0), "order-1", int64(1), int64(0), "ref", "cust", "", "")
	f.Add(uint8(5), "sku", int32(1), "adj-1", int64(-5), int64(0), "", "", "recount", "alice")
	f.Add(uint8(1), "sku\x00", int32(300), "k\n", int64(0), int64(-1), "\x7f", "é", "x", "y")
	f.Add(uint8(2), strings.Repeat("s", 65), int32(-1), strings.Repeat("k", 129), int64(1_000_001), int64(90_000_000), "", "", "", "")
	kinds := []OpKind{OpReserve, OpDeduct, OpReplenish, OpCommit, OpRelease, OpAdjust, OpTransferOut, OpTransferIn, OpExpire, "bogus"}
	f.Fuzz(func(t *testing.T, kind uint8, sku string, index int32, key string, q, ttlMS int64, orderRef, customerRef, reason, approver string) {
		r := &Request{Kind: kinds[int(kind)%len(kinds)], Shard: ShardKey{SKU: sku, Index: index}, Key: key, Quantity: q,
			TTL: time.Duration(ttlMS) * time.Millisecond, OrderRef: orderRef, CustomerRef: customerRef, Reason: reason,
			Approver: approver, ReservationID: key, TransferID: key}
		err := ValidateRequest(r)
		if err != nil {
			if !publicCode(err) {
				t.Fatalf("ValidateRequest(%+v) = %v, want a documented code", r, err)
			}
			return
		}
		if ValidateSKU(sku) != nil || index < 0 || index >= ShardsMax {
			t.Fatalf("validated a request on an invalid shard: %+v", r)
		}
		if r.Kind.Keyed() && ValidateKey(key) != nil {
			t.Fatalf("validated a keyed request with an invalid key: %+v", r)
		}
		if (r.Kind == OpReserve || r.Kind == OpDeduct || r.Kind == OpReplenish) && (q < 1 || q > QuantityMax) {
			t.Fatalf("validated a quantity of %d: %+v", q, r)
		}
		for _, s := range []string{orderRef, customerRef, reason, approver} {
			if !utf8.ValidString(s) || !isText(s) {
				t.Fatalf("validated a text %q with control characters or bad UTF-8", s)
			}
		}
	})
}
