package batch

import (
	"sync"
	"testing"
)

func TestQueue_FIFOAndBound(t *testing.T) {
	q := NewQueue[int](3)
	if got := q.Take(10); got != nil {
		t.Fatalf("Take of an empty queue = %v, want nil", got)
	}
	for i := 1; i <= 3; i++ {
		if !q.Push(i) {
			t.Fatalf("Push(%d) refused below the bound", i)
		}
	}
	if q.Push(4) {
		t.Fatal("Push past the bound accepted")
	}
	select {
	case <-q.Ready():
	default:
		t.Fatal("not Ready with items queued")
	}
	if got := q.Take(2); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("Take(2) = %v, want [1 2]", got)
	}
	select {
	case <-q.Ready():
	default:
		t.Fatal("not Ready with an item left behind")
	}
	if !q.Push(5) || q.Len() != 2 {
		t.Fatalf("after a Take there is room: Len %d", q.Len())
	}
	if got := q.Take(10); len(got) != 2 || got[0] != 3 || got[1] != 5 {
		t.Fatalf("Take(10) = %v, want [3 5]", got)
	}
}

// TestQueue_Concurrent: every item pushed by many producers is taken
// exactly once, each producer's in its order, by one consumer that waits
// on Ready.
func TestQueue_Concurrent(t *testing.T) {
	const producers, each = 8, 2000
	q := NewQueue[[2]int](producers * each)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				if !q.Push([2]int{p, i}) {
					t.Error("Push refused below the bound")
					return
				}
			}
		})
	}
	next := make([]int, producers)
	for taken := 0; taken < producers*each; {
		<-q.Ready()
		for _, it := range q.Take(64) {
			if it[1] != next[it[0]] {
				t.Fatalf("producer %d: item %d taken, want %d", it[0], it[1], next[it[0]])
			}
			next[it[0]]++
			taken++
		}
	}
	wg.Wait()
	if q.Len() != 0 {
		t.Fatalf("Len after taking everything = %d", q.Len())
	}
}
