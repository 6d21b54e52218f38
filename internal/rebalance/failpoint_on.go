//go:build shardstock_failpoints

package rebalance

import (
	"os"
	"strings"
	"time"
)

// failpoint pauses at the point named name when SHARDSTOCK_FAILPOINT is
// "name=duration", so that a test can kill the allocator there; it prints
// "failpoint: name" first. Only in binaries built with the
// shardstock_failpoints tag; the variable is read on every call.
func failpoint(name string) {
	at, pause, ok := strings.Cut(os.Getenv("SHARDSTOCK_FAILPOINT"), "=")
	if !ok || at != name {
		return
	}
	if d, err := time.ParseDuration(pause); err == nil && d > 0 {
		os.Stdout.WriteString("failpoint: " + name + "\n")
		time.Sleep(d)
	}
}
