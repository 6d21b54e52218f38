package rebalance

import (
	"testing"
	"time"
)

// TestNew_WithoutStore: a rebalancer without storage (an allocator built
// without a database, for tests of its memory alone) runs no round, since
// a round reads the Store: rounds a millisecond apart, with demand to
// plan, for fifty milliseconds would otherwise dereference the nil Store.
func TestNew_WithoutStore(t *testing.T) {
	r := New(Host{}, Config{Interval: time.Millisecond})
	r.AddDemand("hot", 0, 1000)
	time.Sleep(50 * time.Millisecond)
	r.Close()
}
