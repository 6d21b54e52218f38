package topology

import "context"

// admissionPrefix holds one key per SKU whose waitlist is being worked,
// bound to the worker's lease like a move lease: the admission work of a
// SKU (internal/admission) runs in one allocator at a time.
const admissionPrefix = "/shardstock/admission/"

// TryAdmission takes sku's admission lease under the process's etcd lease
// (the one its move leases share); nil and no error while another process
// holds it. Holding it is a matter of efficiency, not of safety: two
// workers admitting the same ticket reserve with the same key
// (stock.Ticket.ReserveKey), so the shard applies it once.
func (m *MoveLeases) TryAdmission(ctx context.Context, sku string) (*MoveLease, error) {
	got, _, _, err := m.try(ctx, admissionPrefix+sku, sku)
	return got, err
}
