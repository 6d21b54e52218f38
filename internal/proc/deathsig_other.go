//go:build !linux

package proc

import "syscall"

// DieWithParent does nothing: only Linux has a parent-death signal, so
// elsewhere a parent that crashes or is killed leaves its children
// running (a parent that stops normally still stops them).
func (c *Cmd) DieWithParent(sig syscall.Signal) {}
