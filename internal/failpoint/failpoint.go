//go:build !shardstock_failpoints

// Package failpoint holds the fault-injection points the end-to-end tests
// stop a process at. They do nothing unless the binary is built with the
// shardstock_failpoints tag (failpoint_on.go), as internal/e2e builds the
// shard server and the allocator; a production binary has no such code.
//
// SHARDSTOCK_FAILPOINT names the point and what to do there: "name=D"
// sleeps D at Pause(name), "name=stop" stops the whole process (SIGSTOP)
// at Stop(name), so that a test can kill it there as if it had crashed.
// Either prints "failpoint: name" on stdout first. The variable is read on
// every call.
package failpoint

// Pause sleeps at the point name when SHARDSTOCK_FAILPOINT is
// "name=duration".
func Pause(name string) {}

// Stop stops the process at the point name when SHARDSTOCK_FAILPOINT is
// "name=stop".
func Stop(name string) {}
