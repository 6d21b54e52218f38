package batch

import "sync"

// queueKeptMax is the capacity an emptied Queue keeps; above it the
// backing array goes back to the allocator.
const queueKeptMax = 64

// Queue is a FIFO of at most max items whose memory follows what it holds.
// A buffered channel of max slots allocates and zeroes them all when made:
// a shard writer, started on first use for every shard a sale touches,
// paid 32 KiB that way before its first request (a third of the bytes a
// shard server allocated under a many-SKU load). Ready and Take serve one
// consumer; Push any number of producers.
type Queue[T any] struct {
	max   int
	ready chan struct{} // holds a token while items may be waiting

	mu    sync.Mutex
	items []T
}

// NewQueue returns an empty Queue of at most max items.
func NewQueue[T any](max int) *Queue[T] {
	return &Queue[T]{max: max, ready: make(chan struct{}, 1)}
}

// Push appends it; false, and nothing queued, when the queue is full.
func (q *Queue[T]) Push(it T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) >= q.max {
		return false
	}
	q.items = append(q.items, it)
	q.signal()
	return true
}

// Ready receives when items may be waiting: Take then returns them, or
// nothing if another Take got there first.
func (q *Queue[T]) Ready() <-chan struct{} { return q.ready }

// Take removes and returns the oldest items, at most max; nil when empty.
// It never waits. Items left behind keep the queue Ready.
func (q *Queue[T]) Take(max int) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(max, len(q.items))
	if n == 0 {
		return nil
	}
	out := make([]T, n)
	copy(out, q.items)
	rest := copy(q.items, q.items[n:])
	clear(q.items[rest:]) // drop the references the taken items held
	q.items = q.items[:rest]
	if rest == 0 && cap(q.items) > queueKeptMax {
		q.items = nil
	}
	if rest > 0 {
		q.signal()
	}
	return out
}

// Len returns the number of items queued.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// signal leaves a token in ready if none is there. Called with mu held.
func (q *Queue[T]) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}
