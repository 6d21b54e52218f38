package loadgen

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency histograms record microseconds, from 1 µs to latencyMax, with 3
// significant digits.
const (
	latencyMin     = 1
	latencyMax     = int64(2 * time.Minute / time.Microsecond)
	latencyDigits  = 3
	secondsMax     = int(durationMax/time.Second) + int(drainGrace/time.Second) + 1
	neverEnds      = time.Duration(math.MaxInt64)
	detailLinesMax = 20
)

func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(latencyMin, latencyMax, latencyDigits)
}

func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	us := min(max(d.Microseconds(), latencyMin), latencyMax)
	_ = h.RecordValue(us) // in range by construction
}

// opKind is one kind of request.
type opKind uint8

const (
	opDeduct opKind = iota
	opReserve
	opCommit
	opRelease
	opReserveOrder // the cart model's calls
	opCommitOrder
	opRefund
	opKinds
)

func (k opKind) String() string {
	return [...]string{"deduct", "reserve", "commit", "release", "reserve-order", "commit-order", "refund"}[k]
}

// Second is what happened in one second of a run, by completion time.
type Second struct {
	Requests, OK, Replayed, OutOfStock, Errors int64
}

// answer is one attempt's result, with times since the run's start.
type answer struct {
	o          Outcome
	id         string
	start, end time.Duration
	abandoned  bool
}

// keyID names an idempotency key of a SKU.
type keyID struct {
	sku int32
	key string
}

// keyObs is what clients saw of one idempotency key.
type keyObs struct {
	op           opKind // opDeduct or opReserve
	qty          int64
	ok, replayed int32
	unresolved   bool
	id           string // the reservation id a reserve's answer gave
}

// resObs is what clients saw of one reservation after it was granted.
type resObs struct {
	sku                   int32
	key                   string // the reserve's idempotency key
	qty                   int64
	commitOK, commitRepl  int32
	releaseOK, releaseRpl int32
	unresolved            bool
}

// oosEvent is one out-of-stock answer to a deduct or reserve.
type oosEvent struct {
	sku   int32
	qty   int64
	start time.Duration
}

// releaseEvent is a release that may have returned stock, and the latest
// moment by which it had (neverEnds when the client never learned).
type releaseEvent struct {
	sku int32
	qty int64
	end time.Duration
}

// tally is what one worker saw; tallies merge at the end of a run, so the
// hot path takes no lock.
type tally struct {
	requests, ok, replayed, oos, errors int64
	byOp                                [opKinds]int64
	errorsByCode                        map[string]int64
	errorSamples                        map[string]string // code -> a message
	latency, oosLatency                 *hdrhistogram.Histogram
	seconds                             []Second
	keys                                map[keyID]*keyObs
	reservations                        map[string]*resObs
	oosEvents                           []oosEvent
	releases                            []releaseEvent
	slowAfter                           time.Duration // 0: keep none
	slowMax                             int
	slow                                []Span
	slowDropped                         int64
	carts                               []*cartObs // the cart model's orders
}

// newTally returns an empty tally that keeps up to slowMax answers slower
// than slowAfter.
func newTally(slowAfter time.Duration, slowMax int) *tally {
	return &tally{
		slowAfter:    slowAfter,
		slowMax:      slowMax,
		errorsByCode: map[string]int64{},
		errorSamples: map[string]string{},
		latency:      newHistogram(),
		oosLatency:   newHistogram(),
		keys:         map[keyID]*keyObs{},
		reservations: map[string]*resObs{},
	}
}

// worker is one client of a run.
type worker struct {
	rng *rand.Rand
	t   *tally
	// typical is a moving average of this client's latency: abandoned
	// requests are cancelled at a random moment within it.
	typical time.Duration
}

// attempt records one answer.
func (t *tally) attempt(op opKind, sku int32, qty int64, a answer) {
	t.requests++
	t.byOp[op]++
	sec := min(int(a.end/time.Second), secondsMax)
	for len(t.seconds) <= sec {
		t.seconds = append(t.seconds, Second{})
	}
	s := &t.seconds[sec]
	s.Requests++
	switch a.o.Status {
	case StatusOK:
		t.ok++
		s.OK++
	case StatusReplayed:
		t.replayed++
		s.Replayed++
	case StatusOutOfStock:
		t.oos++
		s.OutOfStock++
		recordLatency(t.oosLatency, a.end-a.start)
		if op == opDeduct || op == opReserve {
			t.oosEvents = append(t.oosEvents, oosEvent{sku: sku, qty: qty, start: a.start})
		}
	default:
		t.errors++
		s.Errors++
		code := a.o.Code
		if code == "" {
			code = CodeUnknown
		}
		t.errorsByCode[code]++
		if _, ok := t.errorSamples[code]; !ok && a.o.Detail != "" {
			t.errorSamples[code] = a.o.Detail
		}
	}
	// An abandoned attempt's latency is the client's choice, not the target's.
	if !a.abandoned {
		recordLatency(t.latency, a.end-a.start)
		if t.slowAfter > 0 && a.end-a.start > t.slowAfter {
			t.keepSlow(Span{Start: a.start, End: a.end})
		}
	}
}

// merge adds o into t.
func (t *tally) merge(o *tally) {
	t.requests += o.requests
	t.ok += o.ok
	t.replayed += o.replayed
	t.oos += o.oos
	t.errors += o.errors
	for i := range t.byOp {
		t.byOp[i] += o.byOp[i]
	}
	for c, n := range o.errorsByCode {
		t.errorsByCode[c] += n
	}
	for c, d := range o.errorSamples {
		if _, ok := t.errorSamples[c]; !ok {
			t.errorSamples[c] = d
		}
	}
	t.latency.Merge(o.latency)
	t.oosLatency.Merge(o.oosLatency)
	for _, sp := range o.slow {
		t.keepSlow(sp)
	}
	t.slowDropped += o.slowDropped
	for len(t.seconds) < len(o.seconds) {
		t.seconds = append(t.seconds, Second{})
	}
	for i, s := range o.seconds {
		d := &t.seconds[i]
		d.Requests += s.Requests
		d.OK += s.OK
		d.Replayed += s.Replayed
		d.OutOfStock += s.OutOfStock
		d.Errors += s.Errors
	}
	for id, k := range o.keys {
		if m, ok := t.keys[id]; ok {
			m.ok += k.ok
			m.replayed += k.replayed
			m.unresolved = m.unresolved || k.unresolved
			if m.id == "" {
				m.id = k.id
			}
		} else {
			t.keys[id] = k
		}
	}
	for id, r := range o.reservations {
		if m, ok := t.reservations[id]; ok {
			m.commitOK += r.commitOK
			m.commitRepl += r.commitRepl
			m.releaseOK += r.releaseOK
			m.releaseRpl += r.releaseRpl
			m.unresolved = m.unresolved || r.unresolved
		} else {
			t.reservations[id] = r
		}
	}
	t.oosEvents = append(t.oosEvents, o.oosEvents...)
	t.releases = append(t.releases, o.releases...)
	t.carts = append(t.carts, o.carts...)
}
