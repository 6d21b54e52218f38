package allocator

import (
	"fmt"
	"testing"
)

// TestDoubtBook: a key is in doubt from hold to forget; a book that
// overflows holds every key in doubt rather than drop one.
func TestDoubtBook(t *testing.T) {
	var b doubtBook
	if b.holds("a") {
		t.Errorf("holds(a) on an empty book = true, want false")
	}
	b.hold("a")
	if !b.holds("a") || b.holds("b") {
		t.Errorf("after hold(a): holds(a), holds(b) = %v, %v, want true, false", b.holds("a"), b.holds("b"))
	}
	b.forget("a")
	if b.holds("a") {
		t.Errorf("holds(a) after forget(a) = true, want false")
	}
	for i := range doubtKeysMax {
		b.hold(fmt.Sprint("k", i))
	}
	if b.holds("never-held") {
		t.Fatalf("holds(never-held) with the book just full = true, want false")
	}
	b.hold("one-too-many")
	if !b.holds("never-held") || !b.holds("one-too-many") {
		t.Errorf("after an overflow: holds(never-held), holds(one-too-many) = %v, %v, want true, true", b.holds("never-held"), b.holds("one-too-many"))
	}
}
