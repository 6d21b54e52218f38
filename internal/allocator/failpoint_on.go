//go:build shardstock_failpoints

package allocator

import (
	"os"
	"time"
)

// failpointAfterDebit pauses between a transfer's debit and its credit for
// SHARDSTOCK_FAILPOINT_AFTER_DEBIT (a duration), so that a test can kill the
// allocator there. Only in binaries built with the shardstock_failpoints
// tag; the pause is read on every call, so a test can set it in the
// process's environment at start.
func failpointAfterDebit() {
	if d, err := time.ParseDuration(os.Getenv("SHARDSTOCK_FAILPOINT_AFTER_DEBIT")); err == nil && d > 0 {
		os.Stdout.WriteString("failpoint: after debit\n")
		time.Sleep(d)
	}
}
