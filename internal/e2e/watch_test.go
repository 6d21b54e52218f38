package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// ledgerConsumer is a WatchLedger consumer attached to a stack throughout a
// fault test, run as a consumer would be: `stockctl -json watch ledger`, a
// child process, whose lines it parses. It keeps the cursor of the last
// line it read and, whenever the process exits (the stream ended: the
// allocator lost Postgres, a network error) or is killed (kill: SIGKILL),
// starts another from it. What it receives is kept session by session: a
// session is one process, from its start to its exit.
type ledgerConsumer struct {
	t   *testing.T
	s   *stack
	sku string

	mu       sync.Mutex
	cursor   string
	sessions [][]*v1.LedgerEntry
	ends     []string    // how each session that was neither killed nor stopped ended
	proc     *os.Process // the current session's, while it runs
	killed   bool        // the current session's process was killed
	kills    int
}

// Bounds of a ledgerConsumer.
const (
	// consumerResumePause is how long the consumer waits before it resumes
	// a stream that ended: the allocator may be without Postgres for a
	// while, and a resume every few milliseconds would only spin.
	consumerResumePause = 100 * time.Millisecond
	// consumerCatchUpMax bounds how long after the load the consumer may
	// take to receive the whole ledger: its lag is a poll interval and a
	// few pages, so seconds is generous.
	consumerCatchUpMax = 20 * time.Second
	// consumerKillWaitMax bounds how long kill waits for a running
	// process: a session starts within a resume pause and a process start.
	consumerKillWaitMax = 5 * time.Second
	// consumerLineMax bounds one line of stockctl's output: a message is a
	// ledger entry and a cursor, well under 4 KiB.
	consumerLineMax = 64 << 10
)

// attachConsumer starts a consumer of sku's entries on s; it runs until the
// test ends or stop is called.
func attachConsumer(t *testing.T, s *stack, sku string) (c *ledgerConsumer, stop func()) {
	t.Helper()
	c = &ledgerConsumer{t: t, s: s, sku: sku}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			c.session(ctx)
			pause(ctx, consumerResumePause)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return c, stop
}

// session runs stockctl from the consumer's cursor until it exits, is
// killed, or ctx ends (then it is killed too).
func (c *ledgerConsumer) session(ctx context.Context) {
	c.mu.Lock()
	c.sessions, c.killed = append(c.sessions, nil), false
	n, cursor := len(c.sessions)-1, c.cursor
	c.mu.Unlock()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "stockctl"), "-url", c.s.base, "-json",
		"watch", "ledger", "-cursor", cursor, "-sku", c.sku, "-consumer", "e2e-faults")
	cmd.Env = append(os.Environ(), "SHARDSTOCK_ADMIN_TOKEN="+adminToken)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		c.t.Errorf("start stockctl watch ledger: %v", err)
		return
	}
	c.mu.Lock()
	c.proc = cmd.Process
	c.mu.Unlock()
	r := bufio.NewReaderSize(out, consumerLineMax)
	for {
		// A line is a message once whole: a process killed in the middle
		// of one never printed it.
		line, err := r.ReadSlice('\n')
		if err != nil {
			break
		}
		var m v1.WatchLedgerResponse
		if err := protojson.Unmarshal(line, &m); err != nil || m.Cursor == "" {
			c.t.Errorf("stockctl printed %q: want a message with a cursor (%v)", line, err)
			continue
		}
		c.mu.Lock()
		if m.Entry != nil {
			c.sessions[n] = append(c.sessions[n], m.Entry)
		}
		// The consumer handles the entry, then keeps the cursor after it.
		c.cursor = m.Cursor
		c.mu.Unlock()
	}
	io.Copy(io.Discard, out)
	err = cmd.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.proc = nil
	if c.killed || ctx.Err() != nil {
		return // killed, or stopped
	}
	// stockctl's exit code says the class, its error line the reason.
	c.ends = append(c.ends, fmt.Sprintf("exit %d %s", cmd.ProcessState.ExitCode(), stockctlReason(stderr.String())))
}

// stockctlReason returns the reason of the error stockctl printed last
// ("stockctl: CODE: REASON: message"), else its last line.
func stockctlReason(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if f := strings.SplitN(last, ": ", 4); len(f) == 4 && f[0] == "stockctl" {
		return f[2]
	}
	return last
}

// kill SIGKILLs the consumer's running process, waiting for one to be
// running if need be: the next session resumes from the cursor of the last
// line it printed.
func (c *ledgerConsumer) kill() {
	for deadline := time.Now().Add(consumerKillWaitMax); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		if c.proc != nil && !c.killed {
			c.killed = true
			c.kills++
			c.proc.Signal(syscall.SIGKILL)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			c.t.Errorf("no consumer process to kill within %s", consumerKillWaitMax)
			return
		}
	}
}

// received returns the ids of the entries received in any session; the
// caller holds c.mu.
func (c *ledgerConsumer) received() map[int64]bool {
	got := map[int64]bool{}
	for _, s := range c.sessions {
		for _, e := range s {
			got[e.Id] = true
		}
	}
	return got
}

// check waits until the consumer has received every entry of its SKU's
// ledger, then stops it and checks what it received: every entry of the
// ledger and no other, none twice within a session (again only after a
// resume, at least once), at least kills sessions killed, and, taken in
// the order first received, each shard's entries a chain (each begins
// where the one before it ended).
func (c *ledgerConsumer) check(t *testing.T, stop func(), kills int) {
	t.Helper()
	want := map[int64]bool{}
	for _, e := range c.s.ledger(c.sku) {
		want[e.Id] = true
	}
	start := time.Now()
	for deadline := start.Add(consumerCatchUpMax); ; time.Sleep(50 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.received())
		c.mu.Unlock()
		if n >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the consumer received %d of the ledger's %d entries within %s of the load's end", n, len(want), consumerCatchUpMax)
			break
		}
	}
	caughtUp := time.Since(start)
	stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.received()
	for id := range want {
		if !got[id] {
			t.Errorf("entry %d is in the ledger and was never received", id)
		}
	}
	for id := range got {
		if !want[id] {
			t.Errorf("entry %d was received and is not in the ledger", id)
		}
	}
	if c.kills < kills {
		t.Errorf("the consumer was killed %d times, want %d", c.kills, kills)
	}
	type counts struct{ available, reserved, sold int64 }
	chains := map[int32]counts{}
	seen, again := map[int64]bool{}, 0
	for i, s := range c.sessions {
		inSession := map[int64]bool{}
		for _, e := range s {
			if inSession[e.Id] {
				t.Errorf("session %d received entry %d twice", i, e.Id)
			}
			inSession[e.Id] = true
			if seen[e.Id] {
				again++
				continue // again after a resume: at least once
			}
			seen[e.Id] = true
			before := counts{e.AvailableBefore, e.ReservedBefore, e.SoldBefore}
			if last, ok := chains[e.Shard]; ok && last != before {
				t.Errorf("shard %d: entry %d (%s) starts at %+v, the one received before it ended at %+v", e.Shard, e.Id, e.Kind, before, last)
			}
			chains[e.Shard] = counts{e.AvailableAfter, e.ReservedAfter, e.SoldAfter}
		}
	}
	t.Logf("change stream: %d entries in the ledger, %d received by a stockctl consumer in %d sessions (%d killed; ended otherwise: %v), %d received again after a resume; "+
		"the last received %s after the ledger was read", len(want), len(got), len(c.sessions), c.kills, c.ends, again, caughtUp.Round(time.Millisecond))
}
