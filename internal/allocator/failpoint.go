//go:build !shardstock_failpoints

package allocator

// failpointAfterDebit is a fault-injection point between a transfer's debit
// and its credit; it does nothing unless built with the
// shardstock_failpoints tag (failpoint_on.go), as the end-to-end tests are.
func failpointAfterDebit() {}
