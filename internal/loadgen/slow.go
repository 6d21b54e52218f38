package loadgen

import (
	"math"
	"slices"
	"time"
)

// slowMax bounds the slow answers a run keeps (16 bytes each), over all its
// clients.
const slowMax = 1 << 20

// Span is when one answer was awaited, as times since the run's start.
type Span struct {
	Start, End time.Duration
}

// Latency is the answer's latency.
func (s Span) Latency() time.Duration { return s.End - s.Start }

func (t *tally) keepSlow(s Span) {
	if len(t.slow) >= t.slowMax {
		t.slowDropped++
		return
	}
	t.slow = append(t.slow, s)
}

// Window is a stretch of wall-clock time in which something else happened
// (a disk stall, say).
type Window struct {
	Start, End time.Time
}

// SlowMatch is how a run's answers over its latency goal fell against some
// windows.
type SlowMatch struct {
	Slow      int64 // answers over the goal (those kept)
	InWindows int64 // of which were awaited across a window
	// Outside counts the answers that overlapped no window; SlowOutside
	// those of them over the goal.
	Outside, SlowOutside int64
	// P99Outside is the 99th percentile latency of the answers that
	// overlapped no window; Exact is false when it could not be computed
	// (slow answers were dropped, or no goal was set).
	P99Outside time.Duration
	Exact      bool
}

// MatchSlow matches r's slow answers against ws: an answer overlaps a
// window when it was awaited during any part of it.
func (r *Result) MatchSlow(ws []Window) SlowMatch {
	m := SlowMatch{Slow: int64(len(r.Slow))}
	var outside []time.Duration
	for _, sp := range r.Slow {
		start, end := r.Started.Add(sp.Start), r.Started.Add(sp.End)
		if slices.ContainsFunc(ws, func(w Window) bool { return start.Before(w.End) && w.Start.Before(end) }) {
			m.InWindows++
			continue
		}
		outside = append(outside, sp.Latency())
	}
	total := r.Latency.TotalCount()
	m.Outside = total - m.InWindows
	m.SlowOutside = int64(len(outside))
	if r.Config.LatencyGoal <= 0 || r.SlowDropped > 0 || m.Outside <= 0 {
		return m
	}
	// The answers over the goal are all kept, so the rank of the 99th
	// percentile among the answers outside the windows is either among the
	// answers within the goal (which no window removed: the histogram's own
	// ranks) or among the kept slow ones outside the windows.
	rank := int64(math.Ceil(0.99 * float64(m.Outside)))
	fast := total - m.Slow
	m.Exact = true
	if rank <= fast {
		m.P99Outside = time.Duration(r.Latency.ValueAtQuantile(100*float64(rank)/float64(total))) * time.Microsecond
		return m
	}
	slices.Sort(outside)
	m.P99Outside = outside[rank-fast-1]
	return m
}

// Disk is what a disk probe (package diskprobe) saw during a run: how long a
// small write took to become durable, and when it stalled.
type Disk struct {
	Dir           string
	Syncs         int64
	P50, P99, Max time.Duration
	// Threshold is the sync time from which a sync is a stall.
	Threshold time.Duration
	// Stalls are the syncs of Threshold or more; StallsDropped those the
	// probe counted but did not keep.
	Stalls        []Window
	StallsDropped int64
	Err           error // the probe stopped early
}

// StallTime is the stalls' total duration.
func (d *Disk) StallTime() time.Duration {
	var t time.Duration
	for _, w := range d.Stalls {
		t += w.End.Sub(w.Start)
	}
	return t
}
