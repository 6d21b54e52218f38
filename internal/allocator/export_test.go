package allocator

import "github.com/prometheus/client_golang/prometheus/testutil"

// RoutingCounts returns the sweeps and reroutes the allocator needed.
func (a *Allocator) RoutingCounts() (sweeps, reroutes float64) {
	return testutil.ToFloat64(a.metrics.sweeps), testutil.ToFloat64(a.metrics.reroutes)
}
