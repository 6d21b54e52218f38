package dbset

import (
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/rebalance"
)

// A Set is the storage of each of the allocator's consumers: routing, the
// admin calls and the rebalancer. Checked here, in a test, because the
// interfaces are declared by packages above dbset in the import map.
var (
	_ allocator.RouteStore = (*Set)(nil)
	_ allocator.AdminStore = (*Set)(nil)
	_ rebalance.Store      = (*Set)(nil)
)
