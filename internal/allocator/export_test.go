package allocator

import "github.com/prometheus/client_golang/prometheus/testutil"

// RoutingCounts returns the sold-out checks and reroutes the allocator needed.
func (a *Allocator) RoutingCounts() (checks, reroutes float64) {
	return testutil.ToFloat64(a.metrics.checks), testutil.ToFloat64(a.metrics.reroutes)
}
