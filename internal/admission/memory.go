package admission

import (
	"context"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/keyset"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of RequestToken's sold-out answered from memory (docs/soldout.md,
// "RequestToken").
const (
	// ticketKeysMax bounds the keys kept of one marked SKU: 8 bytes each,
	// 8 MiB. A SKU with more tickets is not answered from memory (its
	// refusals cost a ticket lookup and a sold-out check each, as without
	// marks).
	ticketKeysMax = 1 << 20
	// ticketKeysTotalMax bounds the keys kept of every marked SKU together
	// (32 MiB); the least recently used SKU's go first, and are read
	// again when it is next asked for.
	ticketKeysTotalMax = 1 << 22
	// ticketSKUsMax bounds the marked SKUs whose ticket keys are kept: a
	// process sells few SKUs under admission at once.
	ticketSKUsMax = 1 << 12
	// keyReadsMax bounds the key reads running at once (a goroutine and a
	// connection each).
	keyReadsMax = 16
	// keyReadInterval is the least time between two key reads of one SKU:
	// a read that found tickets still open (the worker answers them
	// SOLD_OUT within a pass) is tried again after it, not at each call.
	keyReadInterval = 250 * time.Millisecond
	// keyReadTimeout bounds one key read.
	keyReadTimeout = 10 * time.Second
)

// memory answers RequestToken for a SKU marked sold out for good: per
// such SKU, the hashes of every ticket's key, read under the SKU's
// admission lock once no ticket was open (pending, waiting or registered).
type memory struct {
	keys *keyset.Sets

	mu   sync.Mutex
	busy map[string]time.Time // SKUs whose keys are being read, since
}

func newMemory() *memory {
	return &memory{keys: keyset.New(ticketSKUsMax, ticketKeysTotalMax), busy: map[string]time.Time{}}
}

// fromMemory reports whether a RequestToken of key for sku is refused
// OUT_OF_STOCK from memory: sku sells first come, first served, every
// allocator's view marks it sold out for good (nothing available, held
// or in transit), and no ticket of the SKU has the key's hash. A hash
// found (a replay, or a rare collision) goes the usual way and gets its
// first result. A draw is never answered here: its registration holds no
// unit, so a SKU with no stock still registers until its draw.
func (s *Service) fromMemory(sku *stock.SKU, key string) bool {
	if sku.Admission.Mode != stock.AdmissionTokens {
		return false
	}
	rev, marked := s.seller.SoldOutMark(sku.Name)
	if !marked {
		return false
	}
	ks := s.memory.keys.Get(sku.Name)
	if ks == nil || ks.Rev != rev {
		s.readKeys(sku.Name, rev)
		return false
	}
	if !ks.New(s.memory.keys, key) {
		return false
	}
	// A token granted directly has no ticket: its key is its reserve's,
	// an operation of the SKU. Recorded before the mark like every
	// reserve, it is in the allocator's set of them read under the mark.
	if !s.seller.OperationKeyNew(sku.Name, rev, stock.TokenKey(sku.Name, key)) {
		return false
	}
	s.metrics.memoryRefusals.Inc()
	return true
}

// readKeys reads, in the background, the keys of sku's tickets once its
// mark (rev) was seen. The read takes the SKU's admission lock and is kept
// only if no ticket was open then: from then on, while the mark stands, a
// new key cannot be recorded as anything but SOLD_OUT (docs/soldout.md
// says why), so a key absent from the set is answered exactly as the
// usual way would.
func (s *Service) readKeys(sku string, rev int64) {
	m := s.memory
	m.mu.Lock()
	if _, ok := m.busy[sku]; ok || len(m.busy) >= keyReadsMax {
		m.mu.Unlock()
		return
	}
	began := time.Now()
	m.busy[sku] = began
	m.mu.Unlock()
	go func() {
		defer func() {
			// At most one read of a SKU per keyReadInterval.
			time.Sleep(keyReadInterval - time.Since(began))
			m.mu.Lock()
			delete(m.busy, sku)
			m.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), keyReadTimeout)
		defer cancel()
		hashes := []uint64{}
		n, open, err := s.store.TicketKeys(ctx, sku, ticketKeysMax, func(k string) { hashes = append(hashes, m.keys.Hash(k)) })
		if err != nil || open {
			return
		}
		m.keys.Put(sku, rev, hashes, n > ticketKeysMax)
	}()
}
