package stock

import "time"

// ValidateSKU checks a SKU name: 1 to SKULenMax characters from
// [A-Za-z0-9._:-].
func ValidateSKU(sku string) error {
	if sku == "" {
		return Errorf(CodeInvalidSKU, "sku is empty")
	}
	if len(sku) > SKULenMax {
		return Errorf(CodeInvalidSKU, "sku is longer than %d characters", SKULenMax)
	}
	for i := 0; i < len(sku); i++ {
		c := sku[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return Errorf(CodeInvalidSKU, "sku may hold only letters, digits and . _ : -")
		}
	}
	return nil
}

// ValidateKey checks an idempotency key: 1 to IdempotencyKeyLenMax printable
// ASCII characters (0x21 to 0x7e: no spaces, no control characters).
func ValidateKey(key string) error {
	if key == "" {
		return Errorf(CodeInvalidIdempotencyKey, "idempotency_key is empty")
	}
	if len(key) > IdempotencyKeyLenMax {
		return Errorf(CodeInvalidIdempotencyKey, "idempotency_key is longer than %d characters", IdempotencyKeyLenMax)
	}
	if !isToken(key) {
		return Errorf(CodeInvalidIdempotencyKey, "idempotency_key may hold only printable ASCII without spaces")
	}
	return nil
}

// ValidateQuantity checks a reserve, deduct or replenish quantity.
func ValidateQuantity(q int64) error {
	if q <= 0 {
		return Errorf(CodeInvalidQuantity, "quantity must be positive, got %d", q)
	}
	if q > QuantityMax {
		return Errorf(CodeInvalidQuantity, "quantity must be at most %d, got %d", QuantityMax, q)
	}
	return nil
}

// ValidateText checks a free-text field (order_ref, customer_ref, reason,
// approver): at most max bytes of printable ASCII or UTF-8, no control
// characters.
func ValidateText(field, s string, max int) error {
	if len(s) > max {
		return Errorf(CodeInvalidArgument, "%s is longer than %d characters", field, max)
	}
	if !isText(s) {
		return Errorf(CodeInvalidArgument, "%s holds a control character", field)
	}
	return nil
}

// ValidateTTL checks a reservation TTL; zero means the SKU's default.
func ValidateTTL(ttl time.Duration) error {
	if ttl == 0 {
		return nil
	}
	if ttl < ReservationTTLMin || ttl > ReservationTTLMax {
		return Errorf(CodeInvalidArgument, "ttl must be between %s and %s", ReservationTTLMin, ReservationTTLMax)
	}
	return nil
}

// ValidateShards checks a SKU's shard count.
func ValidateShards(n int32) error {
	if n < 1 || n > ShardsMax {
		return Errorf(CodeInvalidArgument, "shards must be between 1 and %d, got %d", ShardsMax, n)
	}
	return nil
}

// isText reports whether s is free text: UTF-8 with no control characters
// (C0, DEL, C1) and no invalid bytes. Spaces and any letters are allowed.
func isText(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0xfffd {
			return false
		}
	}
	return true
}

// isToken reports whether s is an identifier: visible ASCII only (0x21 to
// 0x7e), no spaces.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// ValidateRequest checks a shard request's shape before anything is
// written: the SKU, the key or reservation id, the quantity and every text.
func ValidateRequest(r *Request) error {
	if err := ValidateSKU(r.Shard.SKU); err != nil {
		return err
	}
	if r.Shard.Index < 0 || r.Shard.Index >= ShardsMax {
		return Errorf(CodeInvalidArgument, "shard index %d is out of range", r.Shard.Index)
	}
	switch r.Kind {
	case OpReserve, OpDeduct, OpReplenish:
		if err := ValidateKey(r.Key); err != nil {
			return err
		}
		if IsOrderLineKey(r.Key) && r.Source != SourceOrder {
			return Errorf(CodeInvalidIdempotencyKey, "idempotency_key may not start with %q: it names an order's line", OrderLineKeyPrefix)
		}
		if IsAdmissionKey(r.Key) && r.Source != SourceAdmission {
			return Errorf(CodeInvalidIdempotencyKey, "idempotency_key may not start with %q: it names a token", AdmissionKeyPrefix)
		}
		if err := ValidateQuantity(r.Quantity); err != nil {
			return err
		}
	case OpAdjust:
		if err := ValidateKey(r.Key); err != nil {
			return err
		}
		if err := ValidateDelta(r.Quantity); err != nil {
			return err
		}
		if r.Reason == "" || r.Approver == "" {
			return Errorf(CodeInvalidArgument, "an adjustment needs a reason and an approver")
		}
	case OpRefund:
		if err := ValidateKey(r.Key); err != nil {
			return err
		}
		if err := ValidateQuantity(r.Quantity); err != nil {
			return err
		}
		if err := ValidateSale(r.Shard.SKU, r.Original); err != nil {
			return err
		}
	case OpCommit, OpRelease, OpExtend:
		k, err := ParseReservationID(r.ReservationID)
		if err != nil {
			return err
		}
		if k != r.Shard {
			return Errorf(CodeReservationNotFound, "reservation_id names another shard")
		}
		if r.Kind == OpCommit && (r.Quantity < 0 || r.Quantity > QuantityMax) {
			return Errorf(CodeInvalidQuantity, "quantity must be 0 (all held) to %d, got %d", QuantityMax, r.Quantity)
		}
		if r.Kind == OpExtend && r.TTL == 0 {
			return Errorf(CodeInvalidArgument, "ttl is required to extend a reservation")
		}
	case OpTransferOut, OpTransferIn:
		if r.TransferID == "" || len(r.TransferID) > TransferIDLenMax || !isToken(r.TransferID) {
			return Errorf(CodeInvalidArgument, "transfer_id is empty, too long or not printable")
		}
	case OpExpire, OpWarm:
	default:
		return Errorf(CodeInvalidArgument, "unknown operation kind %q", r.Kind)
	}
	if err := ValidateTTL(r.TTL); err != nil {
		return err
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"order_ref", r.OrderRef, RefLenMax}, {"customer_ref", r.CustomerRef, RefLenMax},
		{"reason", r.Reason, ReasonLenMax}, {"approver", r.Approver, ApproverLenMax}, {"source", r.Source, ApproverLenMax + len(SourceAdminPrefix)},
		{"caller", r.Caller, CallerLenMax}} {
		if err := ValidateText(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	return nil
}

// ValidateSale checks a refund's original: exactly one of a deduct's key
// or a reservation id, the reservation of sku.
func ValidateSale(sku string, s Sale) error {
	switch {
	case (s.DeductKey == "") == (s.ReservationID == ""):
		return Errorf(CodeInvalidArgument, "original must name one sale: a deduct's key or a reservation id")
	case s.DeductKey != "":
		if err := ValidateKey(s.DeductKey); err != nil {
			return Errorf(CodeInvalidArgument, "original: %s", err.(*Error).Message)
		}
	default:
		k, err := ParseReservationID(s.ReservationID)
		if err != nil {
			return Errorf(CodeSaleNotFound, "original names no reservation")
		}
		if k.SKU != sku {
			return Errorf(CodeSaleNotFound, "original names a reservation of another sku")
		}
	}
	return nil
}

// ValidateMaxHold checks a SKU's max_hold: 0 (the default) or ttl (the
// SKU's reservation TTL) to MaxHoldMax.
func ValidateMaxHold(hold, ttl time.Duration) error {
	if hold != 0 && (hold < ttl || hold > MaxHoldMax) {
		return Errorf(CodeInvalidArgument, "max_hold must be between the reservation ttl (%s) and %s", ttl, MaxHoldMax)
	}
	return nil
}

// ValidateDelta checks an adjustment: non-zero, at most StockMax either way.
func ValidateDelta(d int64) error {
	if d == 0 || d > StockMax || d < -StockMax {
		return Errorf(CodeInvalidQuantity, "delta must be non-zero and at most %d either way, got %d", int64(StockMax), d)
	}
	return nil
}

// PrepareNewSKU completes a new SKU's configuration with the defaults (one
// shard, the default reservation TTL, active) and validates it with its
// initial stock. The allocator and the load generator's in-memory ceiling
// both create SKUs through it.
func PrepareNewSKU(s *SKU, initial int64) error {
	if err := ValidateSKU(s.Name); err != nil {
		return err
	}
	if s.Shards == 0 {
		s.Shards = 1
	}
	if err := ValidateShards(s.Shards); err != nil {
		return err
	}
	if initial < 0 || initial > StockMax {
		return Errorf(CodeInvalidQuantity, "initial_stock must be between 0 and %d", int64(StockMax))
	}
	if err := ValidateLimits(s.MaxPerOrder, s.CustomerLimit); err != nil {
		return err
	}
	if s.ReservationTTL == 0 {
		s.ReservationTTL = ReservationTTLDefault
	}
	if err := ValidateTTL(s.ReservationTTL); err != nil {
		return err
	}
	if err := ValidateMaxHold(s.MaxHold, s.ReservationTTL); err != nil {
		return err
	}
	if err := ValidateAdmission(&s.Admission, s.ReservationTTL); err != nil {
		return err
	}
	s.Status = StatusActive
	return nil
}

// ValidateLimits checks a SKU's max_per_order and customer_limit (0: no
// limit).
func ValidateLimits(maxPerOrder, customerLimit int64) error {
	if maxPerOrder < 0 || maxPerOrder > QuantityMax {
		return Errorf(CodeInvalidArgument, "max_per_order must be between 0 (no limit) and %d", QuantityMax)
	}
	if customerLimit < 0 || customerLimit > StockMax {
		return Errorf(CodeInvalidArgument, "customer_limit must be between 0 (no limit) and %d", int64(StockMax))
	}
	return nil
}
