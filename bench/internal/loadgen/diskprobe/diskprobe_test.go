package diskprobe_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen/diskprobe"
)

func TestProbe_Stalls(t *testing.T) {
	t.Run("Every", func(t *testing.T) {
		dir := t.TempDir()
		// A threshold of 1ns makes every sync a stall: each one is recorded.
		p, err := diskprobe.Start(dir, time.Millisecond, time.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		res := p.Stop()
		if res.Err != nil {
			t.Fatalf("probe error: %v", res.Err)
		}
		// The first sync starts at once and Stop waits for it; a slow disk
		// may allow no second one.
		if res.Syncs < 1 {
			t.Fatalf("%d syncs, want at least 1", res.Syncs)
		}
		if got := res.Latency.TotalCount(); got != res.Syncs {
			t.Errorf("latency histogram holds %d syncs, want %d", got, res.Syncs)
		}
		if int64(len(res.Stalls)) != res.Syncs || res.StallsDropped != 0 {
			t.Errorf("%d stalls over 1ns (%d dropped), want every one of the %d syncs", len(res.Stalls), res.StallsDropped, res.Syncs)
		}
		for i, s := range res.Stalls {
			if s.Took <= 0 || !s.End().After(s.Start) || (i > 0 && s.Start.Before(res.Stalls[i-1].End())) {
				t.Fatalf("stall %d = %+v: want positive, in order, not overlapping the last", i, s)
			}
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
			t.Errorf("probe left %q behind", left)
		}
	})
	t.Run("None", func(t *testing.T) {
		// A threshold no sync reaches records none.
		p, err := diskprobe.Start(t.TempDir(), 0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if res := p.Stop(); res.Err != nil || len(res.Stalls) != 0 || res.Interval != diskprobe.IntervalDefault {
			t.Errorf("probe with a 1h threshold: error %v, %d stalls, interval %v; want none, none, the default interval",
				res.Err, len(res.Stalls), res.Interval)
		}
	})
}

func TestStart_Refuses(t *testing.T) {
	if _, err := diskprobe.Start(filepath.Join(t.TempDir(), "missing"), 0, time.Millisecond); err == nil {
		t.Error("Start(missing directory) = nil error")
	}
	if _, err := diskprobe.Start(t.TempDir(), 0, 0); err == nil {
		t.Error("Start(threshold 0) = nil error")
	}
}
