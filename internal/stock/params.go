package stock

import (
	"crypto/sha256"
	"encoding/binary"
)

// ParamsHash is the hash of a keyed request's parameters. A retry with the
// same key must carry the same parameters, or it is IDEMPOTENCY_KEY_REUSED.
func ParamsHash(r *Request) []byte {
	h := sha256.New()
	var n [8]byte
	field := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(string(r.Kind))
	field(r.Shard.SKU)
	binary.BigEndian.PutUint64(n[:], uint64(r.Quantity))
	h.Write(n[:])
	field(r.OrderRef)
	field(r.CustomerRef)
	if r.Kind == OpRefund {
		field(r.Original.ID())
	}
	return h.Sum(nil)
}
