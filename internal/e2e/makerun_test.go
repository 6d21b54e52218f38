package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/readiness"
)

// Bounds of the `make run` tests.
const (
	// makeRunReadyTimeout includes building cmd/shardstock-dev.
	makeRunReadyTimeout = 4 * time.Minute
	// makeRunStopTimeout is how long make may take to exit once stopped:
	// the dev stack gives its children 15 s (devcmd's stopTimeout) before
	// it kills them, plus room for a loaded machine.
	makeRunStopTimeout = 30 * time.Second
	// makeRunGoneTimeout is how long the stack's processes may outlive
	// make (the kernel delivers parent-death signals at once; this is
	// slack for their exit).
	makeRunGoneTimeout = 10 * time.Second
	// makeRunWaitDelay bounds how long Wait waits for make's output pipes
	// after make exited: a process left behind would hold them open.
	makeRunWaitDelay = 5 * time.Second
	// makeRunOutputMax is how much of the stack's output a test keeps
	// (the last bytes) to print when it fails.
	makeRunOutputMax = 256 << 10
	// devComm is the name of the dev stack's processes in /proc/PID/comm.
	devComm = "shardstock-dev"
)

// TestE2E_MakeRun starts `make run` as a user would (a process, real
// ports), waits for its banner, runs the curl example it prints, then sends
// SIGTERM to its process group and checks that no process is left behind.
//
// It runs twice on one database: a second start, with a new embedded etcd
// whose revisions (the epochs) start again from 1, must own every partition
// again although the database keeps the first run's higher epochs.
func TestE2E_MakeRun(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	db := pgtest.NewMigratedDB(t)
	t.Run("First", func(t *testing.T) { makeRunExamples(t, db) })
	// As if the first run's etcd had lived long: epochs far above what a
	// new etcd's revisions reach by retrying claims.
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "UPDATE partitions SET epoch = 1000000000"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	t.Run("Again", func(t *testing.T) { makeRunExamples(t, db) })
}

// TestE2E_MakeRunStop stops `make run` in each way a user or a process
// manager does, and checks that all of it stops: make, the dev stack, its
// shard servers and allocator, and the port.
func TestE2E_MakeRunStop(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: cannot list the stack's processes")
	}
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, m *makeRun)
	}{
		// A terminal's Ctrl-C: SIGINT to the foreground process group.
		{"Interrupt", func(t *testing.T, m *makeRun) { m.signal(t, -m.pgid, syscall.SIGINT) }},
		// A process manager that knows only the PID it started.
		{"TermMake", func(t *testing.T, m *makeRun) { m.signal(t, m.pgid, syscall.SIGTERM) }},
		// A process manager that stops the whole group (systemd, kill -TERM -PGID).
		{"TermGroup", func(t *testing.T, m *makeRun) { m.signal(t, -m.pgid, syscall.SIGTERM) }},
		// The dev stack dies without a chance to stop its children.
		{"KillDev", func(t *testing.T, m *makeRun) { m.signal(t, m.devPID(t), syscall.SIGKILL) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := startMakeRun(t, pgtest.NewMigratedDB(t))
			m.waitBanner(t)
			if err := dial(m.addr); err != nil {
				t.Fatalf("the banner is printed but %s does not answer: %v", m.addr, err)
			}
			tree := m.tree()
			tc.stop(t, m)
			m.checkStopped(t, tree)
		})
	}
}

// makeRunExamples runs the curl examples of the banner, then stops the
// stack with SIGTERM to its process group.
func makeRunExamples(t *testing.T, db string) {
	m := startMakeRun(t, db)
	banner := m.waitBanner(t)
	text := strings.Join(banner, "\n")
	if !strings.Contains(text, "http://"+m.addr) || !strings.Contains(text, adminToken) || !strings.Contains(text, serviceToken) {
		t.Errorf("banner lacks the URL, the admin token or the service token:\n%s", text)
	}
	var ran int
	for _, l := range banner {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "curl ") {
			continue
		}
		got, err := exec.Command("bash", "-c", l).CombinedOutput()
		if err != nil || !regexp.MustCompile(`^\{"(operation|stock)"`).Match(got) {
			t.Errorf("printed example %q = %s, %v", l, got, err)
		}
		ran++
	}
	if ran < 2 {
		t.Errorf("banner printed %d curl examples, want 2:\n%s", ran, text)
	}
	tree := m.tree()
	m.signal(t, -m.pgid, syscall.SIGTERM)
	m.checkStopped(t, tree)
}

// makeRun is one `make run` in a process group of its own (make is the
// group's leader), on a free port.
type makeRun struct {
	cmd    *exec.Cmd
	pgid   int
	addr   string
	stdout *tailBuffer // make's standard output: the banner
	all    *tailBuffer // standard output and error: the banner and every log
	exited chan struct{}
}

func startMakeRun(t *testing.T, db string) *makeRun {
	t.Helper()
	m := &makeRun{
		addr:   cmdtest.FreeAddr(t),
		stdout: &tailBuffer{max: makeRunOutputMax},
		all:    &tailBuffer{max: makeRunOutputMax},
		exited: make(chan struct{}),
	}
	m.cmd = exec.Command("make", "-C", "../..", "run")
	m.cmd.Env = append(os.Environ(), "SHARDSTOCK_ADDR="+m.addr, "SHARDSTOCK_ADMIN_TOKEN="+adminToken, "SHARDSTOCK_SERVICE_TOKEN="+serviceToken, "DATABASE_URL="+db)
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	m.cmd.Stdout = io.MultiWriter(m.stdout, m.all)
	m.cmd.Stderr = m.all
	m.cmd.WaitDelay = makeRunWaitDelay
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.pgid = m.cmd.Process.Pid
	go func() {
		m.cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() {
		syscall.Kill(-m.pgid, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("make run output (the last %d bytes at most):\n%s", makeRunOutputMax, m.all.String())
		}
	})
	return m
}

// waitBanner waits until the stack says it is ready (its readiness line,
// which follows its banner), and returns the lines of stdout before it:
// the banner.
func (m *makeRun) waitBanner(t *testing.T) []string {
	t.Helper()
	deadline := time.Now().Add(makeRunReadyTimeout)
	for {
		lines := strings.Split(m.stdout.String(), "\n")
		if i := slices.IndexFunc(lines, func(l string) bool {
			r, ok := readiness.Parse(l)
			return ok && r.Role == readiness.RoleDev
		}); i >= 0 {
			return lines[:i]
		}
		select {
		case <-m.exited:
			t.Fatalf("make run ended before it was ready: %v", m.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("make run not ready within %s", makeRunReadyTimeout)
		}
	}
}

func (m *makeRun) signal(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("kill(%d, %v) = %v", pid, sig, err)
	}
}

// tree returns make and its descendants.
func (m *makeRun) tree() []osProc {
	ps := processes()
	var out []osProc
	for _, p := range ps {
		for q, ok := p, true; ok; q, ok = ps[q.ppid] {
			if q.pid == m.pgid {
				out = append(out, p)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b osProc) int { return a.pid - b.pid })
	return out
}

// devPID returns the dev stack's own process: the shardstock-dev whose
// parent is not one (its children are shardstock-dev too).
func (m *makeRun) devPID(t *testing.T) int {
	t.Helper()
	ps := processes()
	for _, p := range m.tree() {
		if p.comm == devComm && ps[p.ppid].comm != devComm {
			return p.pid
		}
	}
	t.Fatalf("no %s process under make:\n%s", devComm, formatProcs(m.tree()))
	return 0
}

// checkStopped checks that make exits within makeRunStopTimeout, that
// then every process of tree (make and its descendants when the signal
// was sent) and of make's process group is gone within
// makeRunGoneTimeout, and that the port no longer answers.
func (m *makeRun) checkStopped(t *testing.T, tree []osProc) {
	t.Helper()
	start := time.Now()
	select {
	case <-m.exited:
		t.Logf("make exited %s after the signal: %v", time.Since(start).Round(time.Millisecond), m.cmd.ProcessState)
	case <-time.After(makeRunStopTimeout):
		t.Fatalf("make did not exit within %s; processes:\n%s", makeRunStopTimeout, formatProcs(m.tree()))
	}
	var left []osProc
	for deadline := time.Now().Add(makeRunGoneTimeout); ; time.Sleep(100 * time.Millisecond) {
		left = left[:0]
		ps := processes()
		for _, p := range ps {
			if p.pgrp == m.pgid || slices.ContainsFunc(tree, func(q osProc) bool { return q.pid == p.pid && q.comm == p.comm }) {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("processes left %s after make exited (of these before the signal:\n%s):\n%s",
			makeRunGoneTimeout, formatProcs(tree), formatProcs(left))
	}
	if err := dial(m.addr); err == nil {
		// The port is free once the stack is gone, and anything may take
		// it then (this test's own process listens on ports the kernel
		// picks: embedded etcd, test servers): a listener of a process not
		// of the stack, or none (a dial that met its own ephemeral port),
		// is not the stack still serving.
		owners := listeners(m.addr)
		if len(owners) == 0 {
			t.Logf("%s answered a dial, but no process listens there (a TCP self-connect)", m.addr)
		}
		for _, p := range owners {
			if p.pgrp == m.pgid || slices.ContainsFunc(tree, func(q osProc) bool { return q.pid == p.pid }) {
				t.Errorf("%s still answers after make run stopped: %s", m.addr, formatProcs([]osProc{p}))
			} else {
				t.Logf("%s was taken again, by a process not of the stack: %s", m.addr, formatProcs([]osProc{p}))
			}
		}
	}
}

// listeners returns the live processes with a TCP socket listening on
// addr's port (from /proc/net/tcp and tcp6, and each process's fds).
func listeners(addr string) []osProc {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return nil
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		// sl local_address rem_address st ... uid timeout inode
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			if i := strings.LastIndexByte(f[1], ':'); i >= 0 && f[1][i+1:] == fmt.Sprintf("%04X", n) {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	var out []osProc
	for pid, p := range processes() {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			if link, err := os.Readlink(fd); err == nil && inodes[link] {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// osProc is one live process, from /proc/PID/stat.
type osProc struct {
	pid, ppid, pgrp int
	comm            string
}

// processes returns the live processes by pid; zombies (exited, not yet
// reaped) count as gone.
func processes() map[int]osProc {
	out := map[int]osProc{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range dirs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(s[:open]))
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		out[pid] = osProc{pid: pid, ppid: ppid, pgrp: pgrp, comm: s[open+1 : closing]}
	}
	return out
}

func formatProcs(ps []osProc) string {
	var b strings.Builder
	for _, p := range ps {
		args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
		fmt.Fprintf(&b, "  pid %d ppid %d pgrp %d %s: %s\n", p.pid, p.ppid, p.pgrp, p.comm, bytes.ReplaceAll(bytes.TrimRight(args, "\x00"), []byte{0}, []byte{' '}))
	}
	return b.String()
}

// dial reports whether something accepts a TCP connection on addr.
func dial(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent
// use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// TestListeners: the port check of checkStopped names the process that
// listens, on IPv4 and IPv6, and no process once the listener is closed.
func TestListeners(t *testing.T) {
	for _, network := range []string{"127.0.0.1:0", "[::1]:0"} {
		l, err := net.Listen("tcp", network)
		if err != nil {
			t.Logf("%s: %v (skipped)", network, err)
			continue
		}
		addr := l.Addr().String()
		if ps := listeners(addr); len(ps) != 1 || ps[0].pid != os.Getpid() {
			t.Errorf("listeners(%s) = %v, want this process (%d)", addr, ps, os.Getpid())
		}
		l.Close()
		if ps := listeners(addr); len(ps) != 0 {
			t.Errorf("listeners(%s) after close = %v, want none", addr, ps)
		}
	}
}
