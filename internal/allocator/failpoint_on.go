//go:build shardstock_failpoints

package allocator

import (
	"os"
	"strconv"
	"syscall"
)

// lineFailpoint stops the whole process (SIGSTOP) before an order's line
// is taken when SHARDSTOCK_FAILPOINT is "order-line-N=stop" and line is
// N, i.e. after N lines are held, so that a test can kill it there
// (SIGKILL) as if it had crashed; it prints "failpoint: order-line-N"
// first. Test-only: only in binaries built with the shardstock_failpoints
// tag, and inert unless the variable is set (it is read on every call).
func lineFailpoint(line int) {
	name := "order-line-" + strconv.Itoa(line)
	if os.Getenv("SHARDSTOCK_FAILPOINT") != name+"=stop" {
		return
	}
	os.Stdout.WriteString("failpoint: " + name + "\n")
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}
