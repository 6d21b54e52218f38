package stock

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
)

// reservationIDPrefix versions the reservation token format.
const reservationIDPrefix = "r1."

// ReservationIDLenMax bounds the reservation id accepted from clients.
const ReservationIDLenMax = 256

// NewReservationID returns an opaque token that encodes the SKU and shard, so
// Commit and Release route without a lookup.
func NewReservationID(shard ShardKey) string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("stock: crypto/rand: " + err.Error())
	}
	return reservationIDPrefix + base64.RawURLEncoding.EncodeToString([]byte(shard.SKU)) + "." +
		strconv.Itoa(int(shard.Index)) + "." + hex.EncodeToString(b[:])
}

// ParseReservationID returns the shard a reservation id names.
func ParseReservationID(id string) (ShardKey, error) {
	bad := Errorf(CodeReservationNotFound, "reservation_id is not a reservation")
	if id == "" {
		return ShardKey{}, Errorf(CodeInvalidArgument, "reservation_id is empty")
	}
	if len(id) > ReservationIDLenMax || !strings.HasPrefix(id, reservationIDPrefix) {
		return ShardKey{}, bad
	}
	parts := strings.Split(id[len(reservationIDPrefix):], ".")
	if len(parts) != 3 || len(parts[2]) != 24 {
		return ShardKey{}, bad
	}
	sku, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || ValidateSKU(string(sku)) != nil {
		return ShardKey{}, bad
	}
	idx, err := strconv.Atoi(parts[1])
	if err != nil || idx < 0 || idx >= ShardsMax {
		return ShardKey{}, bad
	}
	if _, err := hex.DecodeString(parts[2]); err != nil {
		return ShardKey{}, bad
	}
	return ShardKey{SKU: string(sku), Index: int32(idx)}, nil
}

// TransferIDLenMax bounds a transfer id.
const TransferIDLenMax = 64

// NewTransferID returns a fresh transfer id.
func NewTransferID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("stock: crypto/rand: " + err.Error())
	}
	return "t1." + hex.EncodeToString(b[:])
}
