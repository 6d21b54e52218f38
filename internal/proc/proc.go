// Package proc starts child processes that all stop the same way: a
// signal of the caller's choice (SIGTERM, SIGINT), then SIGKILL if the
// process has not exited within its grace period. It is exec.Cmd's Cancel
// and WaitDelay, set up in one place.
package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Cmd is an exec.Cmd that stops by a signal when its context ends or Stop
// is called, and is killed if it has not exited within its grace period.
// Set the embedded Cmd's fields (Env, Stdout, SysProcAttr) before Start.
type Cmd struct {
	*exec.Cmd
	ctx    context.Context
	cancel context.CancelFunc
	grace  time.Duration

	mu  sync.Mutex
	sig os.Signal // the stop signal; StopWith may change it
}

// Command returns a command for name and args that, once started, gets
// sig when ctx ends or Stop is called, and SIGKILL if it has not exited
// within grace of that (Wait then returns). A process that should outlive
// the caller's context takes context.Background() and is ended by Stop.
func Command(ctx context.Context, sig os.Signal, grace time.Duration, name string, args ...string) *Cmd {
	ctx, cancel := context.WithCancel(ctx)
	c := &Cmd{Cmd: exec.CommandContext(ctx, name, args...), ctx: ctx, cancel: cancel, grace: grace, sig: sig}
	c.Cmd.Cancel = func() error { return c.Process.Signal(c.stopSignal()) }
	c.Cmd.WaitDelay = grace
	return c
}

// Stop asks the process to stop with its stop signal, and has it killed if
// it has not exited within the grace period. It does not wait: Wait does.
// Later calls do nothing; so does a call after the context ended.
func (c *Cmd) Stop() { c.cancel() }

// StopWith is Stop with sig instead of the stop signal the command was
// made with (e.g. SIGQUIT for Postgres's immediate shutdown). It does
// nothing if the process was already asked to stop.
func (c *Cmd) StopWith(sig os.Signal) {
	c.mu.Lock()
	if c.ctx.Err() == nil {
		c.sig = sig
	}
	c.mu.Unlock()
	c.cancel()
}

// stopSignal returns the signal Cancel sends.
func (c *Cmd) stopSignal() os.Signal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sig
}

// Wait waits for the process to exit, as exec.Cmd's Wait, with two
// differences: a process that exits with status 0 after it was asked to
// stop has not failed (exec reports the context's error then), and one
// killed because it outlived its grace period says so.
func (c *Cmd) Wait() error {
	err := c.Cmd.Wait()
	defer c.cancel() // release the context of a process that ended by itself
	st := c.ProcessState
	switch {
	case st == nil || c.ctx.Err() == nil || errors.Is(err, exec.ErrWaitDelay):
		return err
	case st.Success():
		return nil
	case Killed(st):
		return fmt.Errorf("%s did not stop within %s of %s: killed", filepath.Base(c.Path), c.grace, signalName(c.stopSignal()))
	}
	return err
}

// Killed reports whether a process ended by SIGKILL.
func Killed(st *os.ProcessState) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// signalName returns the conventional name of the stop signals in use
// (os.Signal's String is "terminated", "interrupt").
func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return sig.String()
}
