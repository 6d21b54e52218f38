//go:build !linux

package failpoint

import (
	"os"
	"syscall"
)

// stopSelf stops the whole process (SIGSTOP); the caller may run on
// briefly (see stop_linux.go).
func stopSelf() { syscall.Kill(os.Getpid(), syscall.SIGSTOP) }
