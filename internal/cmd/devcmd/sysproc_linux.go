package devcmd

import "syscall"

// childSysProcAttr gives a child SIGKILL as parent-death signal, so that a
// dev stack that is killed (SIGKILL, a crash) does not leave its servers
// running. The kernel sends it when the OS thread that started the child
// exits; the Go runtime keeps its threads for the life of the process
// (this package locks no goroutine to a thread).
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
