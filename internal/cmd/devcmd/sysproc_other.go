//go:build !linux

package devcmd

import "syscall"

// childSysProcAttr is empty: without Linux's parent-death signal, a dev
// stack that is killed (SIGKILL, a crash) leaves its children running;
// SIGINT and SIGTERM still stop them.
func childSysProcAttr() *syscall.SysProcAttr { return nil }
