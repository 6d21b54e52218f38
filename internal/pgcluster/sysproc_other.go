//go:build !linux

package pgcluster

import "syscall"

// serverSysProcAttr runs postgres as cred in its own process group so a
// terminal's Ctrl-C reaches only our process, which then calls Stop.
// Without Linux's parent-death signal, a crashed parent leaves it running.
func serverSysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
