package main

import (
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/loadgentest"
	"github.com/shardstock/shardstock/internal/proccpu"
)

// turnLog records, in order, which turn target was called: a run of
// calls to one target is one entry; Close is an entry of its own.
type turnLog struct {
	mu      sync.Mutex
	entries []string
}

func (l *turnLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.entries); n == 0 || l.entries[n-1] != e {
		l.entries = append(l.entries, e)
	}
}

// turnTarget is the memory target under its own name, logging its calls.
type turnTarget struct {
	*loadgentest.Memory
	name string
	log  *turnLog
}

func (t turnTarget) Name() string { return t.name }

func (t turnTarget) Deduct(ctx context.Context, sku, key string, qty int64) loadgen.Outcome {
	t.log.add(t.name)
	return t.Memory.Deduct(ctx, sku, key, qty)
}

func (t turnTarget) Close() error {
	t.log.add("close " + t.name)
	return t.Memory.Close()
}

// -interleave takes the targets in turns, the order reversed every other
// round, verifies each once, and closes them in the reverse order of
// their setups.
func TestRun_Interleave(t *testing.T) {
	log := &turnLog{}
	targets["turn-a"] = func(options) loadgen.Target { return turnTarget{&loadgentest.Memory{}, "turn-a", log} }
	targets["turn-b"] = func(options) loadgen.Target { return turnTarget{&loadgentest.Memory{}, "turn-b", log} }
	defer delete(targets, "turn-a")
	defer delete(targets, "turn-b")
	out, stderr, err := runArgs(t, env(nil), "-target", "turn-a,turn-b", "-model", "C", "-skus", "10", "-duration", "2s", "-interleave", "4")
	if err != nil {
		t.Fatalf("run() = %v\n%s\n%s", err, out, stderr)
	}
	// Rounds a b, b a, a b, b a: the runs of calls a, b, a, b, a.
	want := "turn-a turn-b turn-a turn-b turn-a close turn-b close turn-a"
	if got := strings.Join(log.entries, " "); got != want {
		t.Errorf("calls and closes %q, want %q", got, want)
	}
	for _, w := range []string{"2 targets in 4 rounds of 500ms each", "turn-a: setup ", "turn-b: setup ", " in 4 windows, verify "} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	for _, w := range []string{"  turn-a ", "  turn-b ", "turn-a: oversold 0", "turn-b: oversold 0"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// What cannot take turns is refused before anything starts, by the
// -interleave check itself.
func TestRun_InterleaveFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-interleave", "-1"},
		{"-interleave", "61"},
		{"-interleave", "4", "-duration", "1s"},
		{"-interleave", "2", "-paced", "0.5"},
		{"-interleave", "2", "-disk-probe", "."},
		{"-interleave", "2", "-model", "C,drop"},
		{"-interleave", "2", "-model", "drop"},
		{"-interleave", "2", "-model", "C,case"},
		{"-interleave", "2", "-requests", "300"},
		{"-interleave", "2", "-server-profile", "prof", "-stack", "/nonexistent"},
		{"-interleave", "2", "-pg-crash-count", "1", "-pg-data", "/nonexistent", "-database-url", "postgres://127.0.0.1:1/x"},
		{"-interleave", "2", "-target", "redis,redis-fsync"},
		{"-interleave", "2", "-target", "redis-api,redis"},
	} {
		c, err := parseConfig(append([]string{"-target", "fake"}, args...), env(nil), io.Discard)
		if err != nil {
			t.Fatalf("parseConfig(%q) = %v", args, err)
		}
		if _, err := c.check(io.Discard); err == nil || !strings.Contains(err.Error(), "-interleave") {
			t.Errorf("check(%q) = %v, want the -interleave check's error", args, err)
		}
	}
	for _, args := range [][]string{{"-interleave", "0"}, {"-interleave", "1"}, {"-interleave", "20", "-duration", "10s", "-target", "redis-fsync,redis-api"}} {
		c, err := parseConfig(append([]string{"-target", "fake"}, args...), env(nil), io.Discard)
		if err != nil {
			t.Fatalf("parseConfig(%q) = %v", args, err)
		}
		if _, err := c.check(io.Discard); err != nil {
			t.Errorf("check(%q) = %v, want nil", args, err)
		}
	}
}

// windowCPU measures each window as cpuHooks does and sums them: this
// process as the server side, busy in each of two windows and between
// them, where it must not count.
func TestWindowCPU(t *testing.T) {
	mr := &modelRun{serverPids: []int{os.Getpid()}, stderr: io.Discard}
	var out *loadgen.CPU
	started, ended := mr.windowCPU(context.Background(), "shardstock", func() loadgen.Target { return nil }, &out)
	const busy = 150 * time.Millisecond
	spin := func() { // this much CPU, however busy the machine
		for c0 := proccpu.Self(); proccpu.Self()-c0 < busy; {
		}
	}
	for range 2 {
		started()
		spin()
		ended()
		spin() // between windows
	}
	if out == nil || out.Err != nil {
		t.Fatalf("windowCPU: %+v, want a measurement", out)
	}
	// Two windows of 150 ms of CPU, read in 10 ms ticks: one window
	// alone (150 ms), or the time between them counted (450 ms), is out.
	if out.Server < 250*time.Millisecond || out.Server > 400*time.Millisecond || out.Client < 250*time.Millisecond || out.Client > 400*time.Millisecond {
		t.Errorf("windowCPU: server %s, client %s: want both windows' (about 300ms each)", out.Server, out.Client)
	}
}

// A CPU measurement summed over windows keeps each part's sum, and the
// first error.
func TestAddCPU(t *testing.T) {
	w := func(s, c, a, b int) *loadgen.CPU {
		return &loadgen.CPU{Server: ms(s), Client: ms(c), Parts: []loadgen.CPUPart{{Name: "Go", Time: ms(a)}, {Name: "Postgres", Time: ms(b)}}}
	}
	sum := addCPU(nil, w(3, 1, 2, 1))
	sum = addCPU(sum, w(5, 2, 3, 2))
	if sum.Server != ms(8) || sum.Client != ms(3) || sum.Parts[0].Time != ms(5) || sum.Parts[1].Time != ms(3) || sum.Err != nil {
		t.Errorf("sum %+v, want server 8ms, client 3ms, Go 5ms, Postgres 3ms", sum)
	}
	bad := &loadgen.CPU{Client: ms(4), Err: context.Canceled}
	if sum = addCPU(sum, bad); sum.Err == nil || sum.Client != ms(7) {
		t.Errorf("sum with a failed window: %+v, want its error and client 7ms (the client's time summed all the same)", sum)
	}
	if sum = addCPU(sum, w(1, 1, 1, 0)); sum.Client != ms(8) || sum.Server != ms(8) {
		t.Errorf("sum after a failed window: %+v, want the client summed (8ms), the server left (8ms)", sum)
	}
	if sum = addCPU(addCPU(nil, w(1, 1, 1, 0)), &loadgen.CPU{Server: ms(1)}); sum.Err == nil {
		t.Errorf("sum over windows of different parts has no error")
	}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }
