package proc

import "syscall"

// DieWithParent has the kernel send the process sig if this process dies
// first (Linux's parent-death signal), so that a parent that crashes or is
// killed leaves no child behind. Call it before Start; it keeps what
// SysProcAttr already holds. The kernel sends the signal when the OS
// thread that started the child exits: the Go runtime keeps its threads
// for the life of the process unless a goroutine locked to its thread
// exits, so start children from goroutines that lock none.
func (c *Cmd) DieWithParent(sig syscall.Signal) {
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Pdeathsig = sig
}
