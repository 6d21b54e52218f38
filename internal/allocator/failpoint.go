//go:build !shardstock_failpoints

package allocator

// lineFailpoint is a fault-injection point of an order's drive, reached
// before line (counted from 0) is taken, so after line lines are held; it
// does nothing unless built with the shardstock_failpoints tag
// (failpoint_on.go), as the end-to-end tests are.
func lineFailpoint(line int) {}
