//go:build !shardstock_failpoints

package rebalance

// failpoint is a fault-injection point of a transfer's steps; it does
// nothing unless built with the shardstock_failpoints tag
// (failpoint_on.go), as the end-to-end tests are. The points:
// "before-create" (the move lease held and its fence raised, nothing
// written), "created" (the transfer pending), "debited" (its source
// debited, the units in transit), "credited" (its destination credited,
// the lease still held).
func failpoint(string) {}
