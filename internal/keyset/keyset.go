// Package keyset keeps, per SKU, a set of idempotency keys as sorted
// hashes, in an LRU bounded both in SKUs and in hashes in all: what the
// allocator's sold-out memory (every operation's key of a SKU marked sold
// out for good) and the admission service's (every ticket's key of such a
// SKU) look a new key up in, with no query. A key whose hash is found (its
// own, or a rare collision) is not new; one not found is.
package keyset

import (
	"hash/maphash"
	"slices"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Sets are the key sets of at most skusMax SKUs, holding at most totalMax
// hashes in all; the least recently used set goes first.
type Sets struct {
	seed     maphash.Seed
	totalMax int

	mu    sync.Mutex
	sets  *lru.Cache[string, *Set] // evictions lower total
	total int                      // hashes in sets
}

// Set is one SKU's keys, read once the mark of revision Rev was seen.
type Set struct {
	Rev    int64
	Over   bool     // more keys than the reader's bound: none kept, nothing is known new
	hashes []uint64 // sorted
}

// New returns empty Sets; skusMax is at least 1.
func New(skusMax, totalMax int) *Sets {
	s := &Sets{seed: maphash.MakeSeed(), totalMax: totalMax}
	sets, err := lru.NewWithEvict(skusMax, func(_ string, k *Set) { s.total -= len(k.hashes) })
	if err != nil {
		panic(err) // only for a size below 1
	}
	s.sets = sets
	return s
}

// Hash is key's hash in these sets.
func (s *Sets) Hash(key string) uint64 { return maphash.String(s.seed, key) }

// Get returns sku's set, or nil.
func (s *Sets) Get(sku string) *Set {
	k, _ := s.sets.Get(sku)
	return k
}

// Put keeps hashes (of keys read, Hash's) as sku's set for the mark of
// revision rev, replacing any earlier one and evicting the least recently
// used sets while the total would pass totalMax; over keeps none.
func (s *Sets) Put(sku string, rev int64, hashes []uint64, over bool) {
	k := &Set{Rev: rev, Over: over}
	if !over {
		slices.Sort(hashes)
		k.hashes = hashes
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets.Remove(sku)
	for s.total+len(k.hashes) > s.totalMax && s.sets.Len() > 0 {
		s.sets.RemoveOldest()
	}
	s.sets.Add(sku, k)
	s.total += len(k.hashes)
}

// New reports whether key is known new to the set: no key read has its
// hash, and the set is not over its bound.
func (k *Set) New(s *Sets, key string) bool {
	if k.Over {
		return false
	}
	_, found := slices.BinarySearch(k.hashes, s.Hash(key))
	return !found
}
