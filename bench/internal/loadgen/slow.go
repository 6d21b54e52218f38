package loadgen

import (
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
	// Rest counts the answers left when those InWindows are set aside
	// (answers within the goal that overlapped a window stay: only the
	// slow ones are kept with their times); SlowRest those of them over
	// the goal.
	Rest, SlowRest int64
	// P99Rest is the 99th percentile latency of the Rest: what the run's
	// p99 would have been without the slow answers the windows account
	// for. Exact is false when it could not be computed (slow answers
	// were dropped, or no goal was set); it is exact to the histogram's
	// precision (3 digits) when it falls within the goal.
	P99Rest time.Duration
	Exact   bool
}

// MatchSlow matches r's slow answers against ws: an answer overlaps a
// window when it was awaited during any part of it.
func (r *Result) MatchSlow(ws []Window) SlowMatch {
	m := SlowMatch{Slow: int64(len(r.Slow))}
	var rest []time.Duration
	for _, sp := range r.Slow {
		start, end := r.Started.Add(sp.Start), r.Started.Add(sp.End)
		if slices.ContainsFunc(ws, func(w Window) bool { return start.Before(w.End) && w.Start.Before(end) }) {
			m.InWindows++
			continue
		}
		rest = append(rest, sp.Latency())
	}
	total := r.Latency.TotalCount()
	m.Rest = total - m.InWindows
	m.SlowRest = int64(len(rest))
	if r.Config.LatencyGoal <= 0 || r.SlowDropped > 0 || m.Rest <= 0 {
		return m
	}
	// Every answer over the goal is kept, so the percentile's rank among
	// the rest is either among the answers within the goal (which nothing
	// set aside: the histogram's own ranks) or among the kept slow ones
	// left. The rank is the histogram's own convention (ValueAtQuantile),
	// so that with no windows this is the run's p99.
	rank := max(int64(0.99*float64(m.Rest)+0.5), 1)
	fast := total - m.Slow
	m.Exact = true
	if rank <= fast {
		m.P99Rest = time.Duration(r.Latency.ValueAtQuantile(100*float64(rank)/float64(total))) * time.Microsecond
		return m
	}
	slices.Sort(rest)
	m.P99Rest = rest[rank-fast-1]
	return m
}

// CPU is the CPU time spent during a run's load: by the server side (the
// processes Procs names: the target's own and its database's, read from
// /proc) and by the load generator itself.
type CPU struct {
	Procs          string
	Server, Client time.Duration
	// Parts split Server by part of the server side (the Go processes and
	// Postgres, the API server and redis-server), when it has more than one.
	Parts []CPUPart
	Err   error // the server side could not be measured
}

// CPUPart is one part's share of a server side's CPU time.
type CPUPart struct {
	Name string
	Time time.Duration
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
