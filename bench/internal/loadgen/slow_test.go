package loadgen_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/loadgentest"
)

// slowEvery answers every tenth deduct after a pause of slowPause.
type slowEvery struct {
	*loadgentest.Memory
	n atomic.Int64
}

const slowPause = 40 * time.Millisecond

func (s *slowEvery) Deduct(ctx context.Context, sku, key string, qty int64) loadgen.Outcome {
	if s.n.Add(1)%10 == 0 {
		loadgen.Sleep(ctx, slowPause)
	}
	return s.Memory.Deduct(ctx, sku, key, qty)
}

func TestResult_Slow(t *testing.T) {
	goal := 25 * time.Millisecond
	res := run(t, &slowEvery{Memory: &loadgentest.Memory{}}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8, LatencyGoal: goal})
	checkCounts(t, res)
	total := res.Latency.TotalCount()
	if n := int64(len(res.Slow)); n < total/10 || res.SlowDropped != 0 {
		t.Fatalf("%d slow answers kept (%d dropped) of %d, want at least the tenth that paused", n, res.SlowDropped, total)
	}
	for _, sp := range res.Slow {
		if sp.Latency() <= goal || sp.Start < 0 || sp.End > res.Elapsed+time.Second {
			t.Fatalf("slow answer %+v: want over %v, within the run (%v)", sp, goal, res.Elapsed)
		}
	}

	// No windows: every answer is outside them, and the 99th percentile is
	// the run's own (a tenth of the answers paused, so it is a slow one).
	m := res.MatchSlow(nil)
	if m.InWindows != 0 || m.Rest != total || m.SlowRest != int64(len(res.Slow)) || !m.Exact {
		t.Errorf("MatchSlow(nil) = %+v, want none in windows, all %d left, exact", m, total)
	}
	want := time.Duration(res.Latency.ValueAtQuantile(99)) * time.Microsecond
	if diff := m.P99Rest - want; m.P99Rest < slowPause || diff < -want/100 || diff > want/100 {
		t.Errorf("p99 with no window = %v, want the run's p99 %v (at least the pause %v)", m.P99Rest, want, slowPause)
	}

	// One window over the whole run: every slow answer was awaited across
	// it, and what is left is the fast answers' 99th percentile.
	all := []loadgen.Window{{Start: res.Started, End: res.Started.Add(res.Elapsed + time.Second)}}
	m = res.MatchSlow(all)
	if m.InWindows != int64(len(res.Slow)) || m.SlowRest != 0 || m.Rest != total-m.InWindows || !m.Exact {
		t.Errorf("MatchSlow(whole run) = %+v, want every slow answer in it", m)
	}
	if m.P99Rest <= 0 || m.P99Rest > goal {
		t.Errorf("p99 without the window's = %v, want a fast answer's (0 to %v)", m.P99Rest, goal)
	}

	// A window before the run touches no answer.
	before := []loadgen.Window{{Start: res.Started.Add(-time.Hour), End: res.Started.Add(-time.Minute)}}
	if got := res.MatchSlow(before); got.InWindows != 0 || got.P99Rest != res.MatchSlow(nil).P99Rest {
		t.Errorf("MatchSlow(before the run) = %+v, want nothing matched", got)
	}

	// The table shows the disk's record beside the run.
	res.Disk = &loadgen.Disk{Dir: "/data", Syncs: 10, P50: time.Millisecond, P99: 30 * time.Millisecond, Max: 40 * time.Millisecond,
		Threshold: goal, Stalls: all}
	var b bytes.Buffer
	if err := loadgen.WriteTable(&b, []*loadgen.Result{res}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"disk (", "in /data;", "10 syncs", "1 stalls", "awaited across a stall", "; p99 without those "} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, b.String())
		}
	}
	// So does the report, with the slow answers over the stall in a chart.
	b.Reset()
	if err := loadgen.WriteReport(&b, []*loadgen.Result{res}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"<h3>The disk</h3>", "10 syncs", `class="stall"`, `class="slow"`, "disk stall at 0s"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("report lacks %q", w)
		}
	}
}

func TestResult_SlowOff(t *testing.T) {
	res := run(t, &slowEvery{Memory: &loadgentest.Memory{}}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8})
	if len(res.Slow) != 0 {
		t.Errorf("%d slow answers kept without a latency goal, want none", len(res.Slow))
	}
	if m := res.MatchSlow(nil); m.Exact {
		t.Errorf("MatchSlow without a goal = %+v, want it not exact", m)
	}
	if _, err := loadgen.NewRunner(loadgen.Config{LatencyGoal: -time.Second}); err == nil {
		t.Error("NewRunner(negative latency goal) = nil error")
	}
}

// verifyAfter records, at Verify, whether the load had ended.
type verifyAfter struct {
	*loadgentest.Memory
	ended          *atomic.Bool
	endedAtVerify  bool
	startedAtSetup bool
	started        *atomic.Bool
}

func (v *verifyAfter) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	v.startedAtSetup = v.started.Load()
	return v.Memory.Setup(ctx, skus)
}

func (v *verifyAfter) Verify(ctx context.Context, skus []loadgen.SKUSpec) (loadgen.State, error) {
	v.endedAtVerify = v.ended.Load()
	return v.Memory.Verify(ctx, skus)
}

// TestRunner_LoadHooks checks that LoadStarted and LoadEnded bracket the
// load: after Setup, before Verify.
func TestRunner_LoadHooks(t *testing.T) {
	var started, ended atomic.Bool
	v := &verifyAfter{Memory: &loadgentest.Memory{}, ended: &ended, started: &started}
	res := run(t, v, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8,
		LoadStarted: func() { started.Store(true) },
		LoadEnded: func() {
			if !started.Load() {
				t.Error("LoadEnded before LoadStarted")
			}
			ended.Store(true)
		}})
	if v.startedAtSetup || !v.endedAtVerify || !ended.Load() {
		t.Errorf("LoadStarted before Setup %v, LoadEnded before Verify %v, called %v: want false, true, true",
			v.startedAtSetup, v.endedAtVerify, ended.Load())
	}
	checkCounts(t, res)
}
