package failpoint

import (
	"os"
	"runtime"
	"syscall"
)

// stopSelf stops the whole process (SIGSTOP), and the calling goroutine
// runs no further until it is continued. The signal is sent to the calling
// thread (tgkill), which takes the process's stop on its return from the
// call. Sent to the process (kill), it is taken by another thread, often
// the main one, and the caller ran on until that thread was scheduled:
// under load, past its next query (an order's fifth line held after the
// failpoint before it; TestStopSelf).
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
