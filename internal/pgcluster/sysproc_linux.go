package pgcluster

import "syscall"

// serverSysProcAttr runs postgres as cred, in its own process group so a
// terminal's Ctrl-C reaches only our process (which then calls Stop), and
// with SIGINT as parent-death signal so a parent that crashes, or is killed
// by a test timeout, does not leave the server running. (The signal fires
// when the forking OS thread exits; the Go runtime keeps its threads.)
func serverSysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGINT}
}
