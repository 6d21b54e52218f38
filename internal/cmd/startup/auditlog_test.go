package startup_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/cmd/startup"
)

// writes records each write: whole lines, how many at once, and can hold
// the writer (gate) to fill the queue.
type writes struct {
	mu    sync.Mutex
	calls []string
	gate  chan struct{} // nil: writes go through
}

func (w *writes) Write(b []byte) (int, error) {
	if w.gate != nil {
		<-w.gate
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, string(b))
	return len(b), nil
}

func (w *writes) all() (string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.calls, ""), len(w.calls)
}

// TestAuditLog_Lines: every line is written whole, with its attributes,
// without Close and several to a write, at most PIPE_BUF (4096 bytes) a
// write unless one line is longer; lines below the level are not.
func TestAuditLog_Lines(t *testing.T) {
	var w writes
	a, err := startup.NewAuditLog(&w, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	log := a.With("component", "test")
	for i := range n {
		log.Info("stock call", "caller", "service:cert:orders", "key", fmt.Sprintf("k%03d", i))
		log.Debug("not at info")
	}
	// The writer writes them all without Close (which writes what is
	// left at once): the bound is far above its flush interval.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if out, _ := w.all(); strings.Count(out, "\n") >= n {
			break
		}
	}
	out, calls := w.all()
	a.Close()
	for i := range n {
		if want := fmt.Sprintf("msg=\"stock call\" component=test caller=service:cert:orders key=k%03d\n", i); !strings.Contains(out, want) {
			t.Fatalf("line %d %q not written: %q", i, want, out)
		}
	}
	if lines := strings.Count(out, "\n"); lines != n || strings.Contains(out, "not at info") {
		t.Errorf("%d lines written, want %d at info only", lines, n)
	}
	if calls >= n/4 {
		t.Errorf("%d lines took %d writes, want a quarter or fewer", n, calls)
	}
	w.mu.Lock()
	for _, c := range w.calls {
		if len(c) > 4096 || !strings.HasSuffix(c, "\n") {
			t.Errorf("a write of %d bytes not ending a line", len(c))
		}
	}
	w.mu.Unlock()
	if a.Dropped() != 0 {
		t.Errorf("Dropped() = %d, want 0", a.Dropped())
	}
}

// TestAuditLog_Full: with the writer held, logging never waits: the lines
// beyond the queue are dropped, counted, and said once the writer goes on;
// the written and the dropped add up to all.
func TestAuditLog_Full(t *testing.T) {
	w := writes{gate: make(chan struct{})}
	a, err := startup.NewAuditLog(&w, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	const n = 10_000 // over the queue (4096) and the writer's buffer
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for i := range n {
			a.Info("stock call", "key", i)
		}
	}()
	select {
	case <-logged:
	case <-time.After(30 * time.Second): // a bound for a hang, not a timing
		t.Fatal("logging waited for a held writer")
	}
	dropped := a.Dropped()
	if dropped == 0 {
		t.Fatal("Dropped() = 0 with the writer held, want the lines beyond the queue")
	}
	close(w.gate)
	a.Close()
	out, _ := w.all()
	written := strings.Count(out, `msg="stock call"`)
	if int64(written)+dropped != n {
		t.Errorf("%d written + %d dropped, want %d", written, dropped, n)
	}
	if want := fmt.Sprintf("dropped_total=%d\n", dropped); !strings.Contains(out, "level=WARN msg=\"audit lines dropped") || !strings.Contains(out, want) {
		t.Errorf("no line says the %d drops (%q): %q", dropped, want, out[max(0, len(out)-400):])
	}
}

// BenchmarkAuditLine: the process CPU (all goroutines, from getrusage) a
// stock call's audit line costs, written to a pipe that another process
// drains (as a container runtime's log pipe): off (the level filters it),
// sync (the process's logger writes it in the call) and async (an
// AuditLog). Paced under the AuditLog's queue (2,048 lines, then a pause
// longer than its flush interval), every mode alike, so that none is
// dropped (dropped/op). Read cpu-ns/op as ratios within one run:
// docs/benchmarks.md.
func BenchmarkAuditLine(b *testing.B) {
	for _, mode := range []string{"off", "sync", "async"} {
		b.Run(mode, func(b *testing.B) {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			drain := exec.Command("cat")
			drain.Stdin, drain.Stdout = r, io.Discard
			if err := drain.Start(); err != nil {
				b.Fatal(err)
			}
			r.Close()
			level, closeLog, dropped := "info", func() {}, func() int64 { return 0 }
			if mode == "off" {
				level = "warn"
			}
			log, err := startup.Logger(w, level, "text")
			if err != nil {
				b.Fatal(err)
			}
			if mode == "async" {
				a, err := startup.NewAuditLog(w, level, "text")
				if err != nil {
					b.Fatal(err)
				}
				log, closeLog, dropped = a.Logger, a.Close, a.Dropped
			}
			ctx := context.Background()
			before := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				if i%2048 == 2047 {
					time.Sleep(60 * time.Millisecond) // CPU-free
				}
				log.LogAttrs(ctx, slog.LevelInfo, "stock call", slog.String("call", "Deduct"), slog.String("caller", "service:token:3f2a9c1b0d4e"),
					slog.String("sku", "hot"), slog.String("key", "k-"+strconv.Itoa(i)), slog.String("reservation", ""),
					slog.Int64("quantity", 1), slog.String("outcome", "ok"))
			}
			closeLog() // its lines written: their CPU counts
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(dropped())/float64(b.N), "dropped/op")
			w.Close()
			drain.Wait()
		})
	}
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
