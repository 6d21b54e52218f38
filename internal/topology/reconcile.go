package topology

import (
	"context"

	"github.com/shardstock/shardstock/internal/ledger"
)

// reconcileKey is held by the allocator running scheduled reconciliation
// (internal/ledger.Scheduler), bound to its process's lease: one pass at a
// time in the cluster, and another allocator takes over when the holder
// dies.
const reconcileKey = "/shardstock/reconcile"

// TryReconcile takes the lease of scheduled reconciliation if no one holds
// it, bound to the process's etcd lease like its move leases; nil, nil
// when another allocator holds it (ledger.SchedulerConfig.TryLease).
func (m *MoveLeases) TryReconcile(ctx context.Context) (ledger.Lease, error) {
	got, _, _, err := m.try(ctx, reconcileKey, "")
	if got == nil {
		return nil, err
	}
	return got, nil
}
