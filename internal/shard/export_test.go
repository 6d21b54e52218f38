package shard

import "time"

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
