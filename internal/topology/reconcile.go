package topology

import "context"

// reconcileKey is held by the allocator running scheduled reconciliation
// (internal/ledger.Scheduler), bound to its process's lease: one pass at a
// time in the cluster, and another allocator takes over when the holder
// dies.
const reconcileKey = "/shardstock/reconcile"

// TryReconcile takes the lease of scheduled reconciliation if no one holds
// it, bound to the process's etcd lease like its move leases; nil, nil
// when another allocator holds it.
func (m *MoveLeases) TryReconcile(ctx context.Context) (*MoveLease, error) {
	got, _, _, err := m.try(ctx, reconcileKey, "")
	return got, err
}
