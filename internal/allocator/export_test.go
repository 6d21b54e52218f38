package allocator

import "github.com/prometheus/client_golang/prometheus/testutil"

// RoutingCounts returns the sold-out checks and reroutes the allocator needed.
func (a *Allocator) RoutingCounts() (checks, reroutes float64) {
	return testutil.ToFloat64(a.metrics.checks), testutil.ToFloat64(a.metrics.reroutes)
}

// MemoryRefusals returns the reserves and deducts the allocator refused
// from memory.
func (a *Allocator) MemoryRefusals() float64 { return testutil.ToFloat64(a.metrics.memoryRefusals) }

// ShardRequests returns the requests the allocator handed to shard
// servers, in its process or over RPC.
func (a *Allocator) ShardRequests() float64 {
	return testutil.ToFloat64(a.metrics.local) + testutil.ToFloat64(a.metrics.remote)
}
