package diskprobe_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/loadgen/diskprobe"
)

func TestProbe_Stalls(t *testing.T) {
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
	if res.Syncs < 2 {
		t.Fatalf("%d syncs in 50ms, want at least 2", res.Syncs)
	}
	if got := res.Latency.TotalCount(); got != res.Syncs {
		t.Errorf("latency histogram holds %d syncs, want %d", got, res.Syncs)
	}
	if int64(len(res.Stalls)) != res.Syncs {
		t.Errorf("%d stalls over 1ns, want every one of the %d syncs", len(res.Stalls), res.Syncs)
	}
	for i, s := range res.Stalls {
		if s.Took <= 0 || !s.End().After(s.Start) || (i > 0 && s.Start.Before(res.Stalls[i-1].End())) {
			t.Fatalf("stall %d = %+v: want positive, in order, not overlapping the last", i, s)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("probe left %q behind", left)
	}

	// A threshold no sync reaches records none.
	p, err = diskprobe.Start(dir, 0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if res := p.Stop(); res.Syncs == 0 || len(res.Stalls) != 0 || res.Interval != diskprobe.IntervalDefault {
		t.Errorf("probe with a 1h threshold: %d syncs, %d stalls, interval %v; want syncs, no stall, the default interval",
			res.Syncs, len(res.Stalls), res.Interval)
	}
}

func TestStart_Refuses(t *testing.T) {
	if _, err := diskprobe.Start(filepath.Join(t.TempDir(), "missing"), 0, time.Millisecond); err == nil {
		t.Error("Start(missing directory) = nil error")
	}
	if _, err := diskprobe.Start(t.TempDir(), 0, 0); err == nil {
		t.Error("Start(threshold 0) = nil error")
	}
}
