package shard

import (
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Hooks for the tests of package shard_test, compiled only with them: the
// product has no knob for these.

// SetBatchSizeMax caps s's batches at n (1: one transaction per request,
// the benchmark's baseline). Call it before s serves.
func SetBatchSizeMax(s *Server, n int) {
	if n > 0 && n < batchSizeMax {
		s.batchMax = n
	}
}

// SetTransferStaleAge makes s's sweep finish transfers left half-way after
// d instead of transferStaleAge. Call it before s serves.
func SetTransferStaleAge(s *Server, d time.Duration) { s.staleAge = d }

// SetGroupDelay makes s's committers hold a group that is not full for d,
// past GroupDelayMax if need be (a test's margin over a slow machine).
// Call it before s serves.
func SetGroupDelay(s *Server, d time.Duration) {
	for _, db := range s.dbs {
		db.committer.groupDelay = d
	}
}

// SetWriterIdle makes s's writers park after parkAfter without work and
// be dropped after idleMax. Call it before s serves.
func SetWriterIdle(s *Server, parkAfter, idleMax time.Duration) {
	s.parkAfter, s.idleMax = parkAfter, idleMax
}

// WriterState is what a test sees of a shard's writer.
type WriterState struct {
	Writer                  any // the writer itself, to compare
	Exists, Running, Loaded bool
	Goroutines              int32 // in its run, now
}

// WriterOf returns the state of k's writer on s.
func WriterOf(s *Server, k stock.ShardKey) WriterState {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.writers[k]
	if w == nil {
		return WriterState{}
	}
	st := WriterState{Writer: w, Exists: true, Running: w.running, Goroutines: w.goroutines.Load()}
	if !w.running {
		st.Loaded = w.loaded // the parked writer's, published by park under s.mu
	}
	return st
}

// DropIdle runs s's drop of writers idle for its idleMax now.
func DropIdle(s *Server) { s.dropIdle() }

// SetWriterIdleMax sets s's idleMax while it serves (dropIdle reads it
// under the same lock).
func SetWriterIdleMax(s *Server, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idleMax = d
}
