package loadgen

import (
	"testing"
	"time"
)

// TestResult_MatchSlow builds a run by hand: fast answers of 1 ms to 10 ms
// and slow ones of 30 ms and more, at known times, against known windows.
func TestResult_MatchSlow(t *testing.T) {
	const goal = 25 * time.Millisecond
	started := time.Now()
	ms := time.Millisecond
	build := func(fast int, slow []Span, dropped int64) *Result {
		r := &Result{Config: Config{LatencyGoal: goal}, Started: started, Latency: newHistogram(), Slow: slow, SlowDropped: dropped}
		for i := range fast {
			recordLatency(r.Latency, time.Duration(1+i%10)*ms)
		}
		for _, sp := range slow {
			recordLatency(r.Latency, sp.Latency())
		}
		return r
	}
	// Ten slow answers, one a second from 1 s, of 30 ms + i ms.
	var slow []Span
	for i := range 10 {
		at := time.Duration(i+1) * time.Second
		slow = append(slow, Span{Start: at, End: at + 30*ms + time.Duration(i)*ms})
	}
	window := func(from, to time.Duration) Window { return Window{Start: started.Add(from), End: started.Add(to)} }

	for _, tc := range []struct {
		name      string
		fast      int
		windows   []Window
		dropped   int64
		inWindows int64
		p99       time.Duration // 0: not exact
	}{
		// 990 fast and 10 slow: the p99's rank (990) is the last fast answer.
		{name: "NoWindows", fast: 990, inWindows: 0, p99: 10 * ms},
		// 190 fast and 10 slow: rank 198 is the eighth slow answer (37 ms).
		{name: "RankAmongSlow", fast: 190, inWindows: 0, p99: 37 * ms},
		// Windows over the 1st, 2nd and 10th slow answers set them aside:
		// 197 left, rank 195 is the fifth of the seven left (slow 3 to 9: 36 ms).
		{name: "SomeInWindows", fast: 190, windows: []Window{window(900*ms, 2500*ms), window(10*time.Second+10*ms, 10*time.Second+11*ms)},
			inWindows: 3, p99: 36 * ms},
		// A window that ends as an answer starts, or starts as it ends, does not overlap it.
		{name: "Touching", fast: 190, windows: []Window{window(0, time.Second), window(2*time.Second+31*ms, 3*time.Second)}, inWindows: 0, p99: 37 * ms},
		// Every slow answer set aside: the rest are the fast ones.
		{name: "AllInWindows", fast: 190, windows: []Window{window(0, time.Minute)}, inWindows: 10, p99: 10 * ms},
		{name: "Dropped", fast: 990, dropped: 1, inWindows: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := build(tc.fast, slow, tc.dropped)
			m := r.MatchSlow(tc.windows)
			if m.Slow != 10 || m.InWindows != tc.inWindows || m.Rest != int64(tc.fast)+10-tc.inWindows || m.SlowRest != 10-tc.inWindows {
				t.Errorf("MatchSlow = %+v, want 10 slow, %d in windows", m, tc.inWindows)
			}
			if m.Exact != (tc.p99 != 0) {
				t.Fatalf("MatchSlow exact = %v, want %v", m.Exact, tc.p99 != 0)
			}
			// Histogram values are within 0.1% of what was recorded.
			if !near(m.P99Rest, tc.p99) {
				t.Errorf("P99Rest = %v, want %v", m.P99Rest, tc.p99)
			}
			if len(tc.windows) == 0 && m.Exact {
				if h := time.Duration(r.Latency.ValueAtQuantile(99)) * time.Microsecond; !near(m.P99Rest, h) {
					t.Errorf("P99Rest with no windows = %v, want the histogram's p99 %v", m.P99Rest, h)
				}
			}
		})
	}
	// The histogram's own rank convention, at a count where rounding and
	// ceiling differ (N = 51: 0.99 x 51 = 50.49).
	r := build(41, slow, 0)
	if got, h := r.MatchSlow(nil).P99Rest, time.Duration(r.Latency.ValueAtQuantile(99))*time.Microsecond; !near(got, h) || got != 38*ms {
		t.Errorf("P99Rest of 51 answers = %v, want the histogram's p99 %v (38ms: rank 50 of 51)", got, h)
	}
	if m := (&Result{Latency: newHistogram()}).MatchSlow(nil); m.Exact {
		t.Errorf("MatchSlow without a goal = %+v, want not exact", m)
	}
}

// near reports whether a and b are within the histogram's precision.
func near(a, b time.Duration) bool { d := a - b; return d >= -b/1000 && d <= b/1000 }

func TestTally_SlowCap(t *testing.T) {
	a, b := newTally(25*time.Millisecond, 1), newTally(25*time.Millisecond, 1)
	for i := range 3 {
		a.attempt(opDeduct, 0, 1, answer{o: Outcome{Status: StatusOK}, start: time.Duration(i) * time.Second, end: time.Duration(i)*time.Second + 30*time.Millisecond})
	}
	b.attempt(opDeduct, 0, 1, answer{o: Outcome{Status: StatusOK}, start: 0, end: 20 * time.Millisecond}) // within the goal
	b.attempt(opDeduct, 0, 1, answer{o: Outcome{Status: StatusError}, start: 0, end: time.Second, abandoned: true})
	if len(a.slow) != 1 || a.slowDropped != 2 {
		t.Errorf("tally with a cap of 1 kept %d and dropped %d of 3 slow answers, want 1 and 2", len(a.slow), a.slowDropped)
	}
	if len(b.slow) != 0 {
		t.Errorf("tally kept %v: want neither an answer within the goal nor an abandoned one", b.slow)
	}
	total := newTally(25*time.Millisecond, 2)
	total.merge(a)
	total.merge(b)
	if len(total.slow) != 1 || total.slowDropped != 2 {
		t.Errorf("merged tally kept %d and dropped %d, want 1 and 2", len(total.slow), total.slowDropped)
	}
}
