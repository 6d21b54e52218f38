package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
)

// memoryServers returns the pids of this process's children that run as
// the memory target's server.
func memoryServers(t *testing.T) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatalf("list processes: %v", err)
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if args := strings.Split(string(cmdline), "\x00"); len(args) > 1 && args[1] == serveMemoryArg {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestMemoryTarget_Process checks that the memory target serves from a
// process of its own, started by Setup and gone after Close.
func TestMemoryTarget_Process(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if pids := memoryServers(t); len(pids) != 0 {
		t.Fatalf("memory servers %v before the test, want none", pids)
	}
	target := newMemoryTarget(options{})
	if target.Name() != "memory" || !loadgen.IsBaseline(target) {
		t.Errorf("Name() = %q, IsBaseline() = %v; want memory, a baseline", target.Name(), loadgen.IsBaseline(target))
	}
	skus := []loadgen.SKUSpec{{SKU: "process-1", Stock: 3, Shards: 2}}
	if err := target.Setup(ctx, skus); err != nil {
		t.Fatalf("Setup() = %v", err)
	}
	pids := memoryServers(t)
	if len(pids) != 1 {
		t.Fatalf("memory servers %v after Setup, want one child process", pids)
	}
	if o := target.Deduct(ctx, "process-1", "k1", 2); o.Status != loadgen.StatusOK {
		t.Errorf("Deduct(2) = %v, want ok", o)
	}
	st, err := target.Verify(ctx, skus)
	if err != nil {
		t.Fatalf("Verify() = %v", err)
	}
	if s := st.SKUs["process-1"]; s.Available != 1 || s.Sold != 2 || len(s.Discrepancies) != 0 {
		t.Errorf("Verify() = %+v, want available 1, sold 2, no discrepancy", s)
	}
	if err := target.Close(); err != nil {
		t.Errorf("Close() = %v, want nil (a clean stop on SIGTERM)", err)
	}
	if left := memoryServers(t); len(left) != 0 {
		t.Errorf("memory servers %v after Close, want none", left)
	}
	if err := syscall.Kill(pids[0], 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("signal 0 to the server (pid %d) after Close = %v, want ESRCH: the process is gone", pids[0], err)
	}
}

// TestRun_Memory runs the case against the memory target, with faults, as
// `loadgen -target memory` does: a clean verdict, and no process left.
func TestRun_Memory(t *testing.T) {
	out, stderr, err := runArgs(t, env(nil), "-target", "memory", "-model", "case", "-dup-rate", "0.2", "-abandon-rate", "0.2")
	if err != nil {
		t.Fatalf("run(-target memory) = %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	verdict := ""
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == len(loadgen.Columns) && f[0] == "memory" {
			verdict = f[len(f)-1]
		}
	}
	if verdict != "ok" {
		t.Errorf("the memory row's verdict = %q, want ok:\n%s", verdict, out)
	}
	want := "  memory: oversold 0, undersold 0 (0 false sold-outs), duplicates 0, lost acknowledged 0, reconciliation differences 0, unresolved 0: all zero"
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if left := memoryServers(t); len(left) != 0 {
		t.Errorf("memory servers %v after run, want none", left)
	}
}
