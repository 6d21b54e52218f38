package keyset

import (
	"fmt"
	"testing"
)

// TestSets: a key read is not new, one not read is; a set over its bound
// knows nothing new; the total bound evicts the least recently used sets,
// and a replaced set's hashes leave the total.
func TestSets(t *testing.T) {
	s := New(4, 10)
	hashes := func(sku string, n int) []uint64 {
		var hs []uint64
		for i := range n {
			hs = append(hs, s.Hash(fmt.Sprint(sku, "-", i)))
		}
		return hs
	}
	s.Put("a", 1, hashes("a", 4), false)
	a := s.Get("a")
	if a == nil || a.Rev != 1 || a.New(s, "a-3") || !a.New(s, "a-4") {
		t.Fatalf("set a = %+v: want rev 1, a-3 read, a-4 new", a)
	}
	s.Put("over", 1, nil, true)
	if s.Get("over").New(s, "anything") {
		t.Error("a set over its bound answered a key new")
	}
	s.Put("b", 2, hashes("b", 4), false)
	s.Get("a") // a is now the most recently used
	s.Put("c", 3, hashes("c", 4), false)
	if s.Get("b") != nil || s.Get("a") == nil || s.Get("c") == nil || s.total != 8 {
		t.Errorf("after c: b %v, a %v, c %v, total %d; want b evicted (least recently used), total 8", s.Get("b"), s.Get("a"), s.Get("c"), s.total)
	}
	s.Put("a", 4, hashes("a", 1), false)
	if got := s.Get("a"); got.Rev != 4 || s.total != 5 {
		t.Errorf("a replaced: rev %d, total %d; want 4 and 5", got.Rev, s.total)
	}
}
