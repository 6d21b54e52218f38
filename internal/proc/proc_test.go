package proc

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loop is a shell script that says it is ready and then runs until a
// signal; traps are prepended, so they are set once it says so.
const loop = "echo ready; while :; do sleep 0.05; done"

// start starts sh -c script with a grace period of grace.
func start(t *testing.T, ctx context.Context, grace time.Duration, script string) *Cmd {
	t.Helper()
	c := Command(ctx, syscall.SIGTERM, grace, "sh", "-c", script)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatalf("Start(%q) = %v", script, err)
	}
	t.Cleanup(func() { c.Process.Kill() })
	if strings.HasSuffix(script, loop) {
		// A signal before sh has set its traps would end it the
		// default way: wait until it says it has.
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			t.Fatalf("sh -c %q said %q, %v; want ready", script, line, err)
		}
	}
	return c
}

func TestCmd(t *testing.T) {
	t.Run("Stop", func(t *testing.T) {
		c := start(t, context.Background(), 10*time.Second, `trap "exit 0" TERM; `+loop)
		c.Stop()
		if err := c.Wait(); err != nil {
			t.Fatalf("Wait() after Stop = %v, want nil", err)
		}
	})
	t.Run("ContextEnd", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		c := start(t, ctx, 10*time.Second, `trap "exit 0" TERM; `+loop)
		cancel()
		if err := c.Wait(); err != nil {
			t.Fatalf("Wait() after the context ended = %v, want nil", err)
		}
	})
	t.Run("Killed", func(t *testing.T) {
		const grace = 200 * time.Millisecond
		c := start(t, context.Background(), grace, `trap "" TERM; `+loop)
		begin := time.Now()
		c.Stop()
		err := c.Wait()
		if err == nil || !strings.Contains(err.Error(), "sh did not stop within 200ms of SIGTERM: killed") || !Killed(c.ProcessState) {
			t.Fatalf("Wait() of a process ignoring SIGTERM = %v (state %v), want killed", err, c.ProcessState)
		}
		if took := time.Since(begin); took < grace {
			t.Fatalf("Wait() returned after %s, want at least the grace period %s", took, grace)
		}
	})
	t.Run("StopWith", func(t *testing.T) {
		c := start(t, context.Background(), 10*time.Second, `trap "exit 3" QUIT; trap "exit 0" TERM; `+loop)
		c.StopWith(syscall.SIGQUIT)
		c.Stop() // too late to change the signal
		var exit *exec.ExitError
		if err := c.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("Wait() after StopWith(SIGQUIT) = %v, want exit status 3", err)
		}
	})
	t.Run("ExitedAlone", func(t *testing.T) {
		c := start(t, context.Background(), 10*time.Second, "exit 2")
		var exit *exec.ExitError
		if err := c.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("Wait() of sh -c 'exit 2' = %v, want exit status 2", err)
		}
	})
}
