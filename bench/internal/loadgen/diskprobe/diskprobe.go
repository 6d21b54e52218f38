// Package diskprobe measures how long a disk takes to make a small write
// durable, while a load runs beside it: an 8 KiB write (one WAL page) and an
// fdatasync, every few milliseconds, into a file of its own. A durable target
// (Postgres committing, Redis with appendfsync always) waits for the same
// kind of sync before it answers, so a stall of the disk stalls its answers,
// and the probe's record says when that happened: loadgen matches its slow
// answers against the stalls (loadgen.Result.Slow).
package diskprobe

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Probe parameters.
const (
	// IntervalDefault is the pause between two syncs: short enough to see
	// every stall that matters to a latency goal of milliseconds, and light
	// beside a database's own commits.
	IntervalDefault = 5 * time.Millisecond
	writeBytes      = 8 << 10 // one Postgres WAL page
	fileBytes       = 1 << 20 // the probe rewrites one MiB, in turn
	// syncMicrosMax bounds the latency histogram (longer syncs count at it).
	syncMicrosMax = int64(10 * time.Minute / time.Microsecond)
	// stallsMax bounds the stalls kept; later ones are only counted.
	stallsMax = 100_000
)

// Stall is one sync that took at least a probe's threshold.
type Stall struct {
	Start time.Time
	Took  time.Duration
}

// End is when the stalled sync returned.
func (s Stall) End() time.Time { return s.Start.Add(s.Took) }

// Result is what the probe saw.
type Result struct {
	Dir       string
	Interval  time.Duration
	Threshold time.Duration
	// Syncs is the number of write-and-sync rounds; Latency holds each one's
	// time in microseconds.
	Syncs   int64
	Latency *hdrhistogram.Histogram
	// Stalls are the syncs that took Threshold or more, in order, up to
	// stallsMax; StallsDropped counts those past it.
	Stalls        []Stall
	StallsDropped int64
	// Err is the write or sync error that stopped the probe early, or a
	// failure to close or remove its file, if any.
	Err error
}

// Probe is a running probe.
type Probe struct {
	f    *os.File
	stop chan struct{}
	done chan struct{}
	res  Result // the loop's until done is closed
}

// Start begins probing a new file in dir every interval (IntervalDefault if
// zero), recording as a stall every sync that takes threshold or more.
func Start(dir string, interval, threshold time.Duration) (*Probe, error) {
	if interval <= 0 {
		interval = IntervalDefault
	}
	if threshold <= 0 {
		return nil, fmt.Errorf("diskprobe: threshold %v: want a positive duration", threshold)
	}
	f, err := os.CreateTemp(dir, "shardstock-diskprobe-*")
	if err != nil {
		return nil, fmt.Errorf("diskprobe: %w", err)
	}
	p := &Probe{f: f, stop: make(chan struct{}), done: make(chan struct{}), res: Result{
		Dir: dir, Interval: interval, Threshold: threshold, Latency: hdrhistogram.New(1, syncMicrosMax, 3),
	}}
	go p.loop()
	return p, nil
}

func (p *Probe) loop() {
	defer close(p.done)
	buf := make([]byte, writeBytes)
	for i := range buf {
		buf[i] = byte(i)
	}
	tick := time.NewTicker(p.res.Interval)
	defer tick.Stop()
	var off int64
	for {
		start := time.Now()
		err := p.sync(buf, off)
		took := time.Since(start)
		off = (off + writeBytes) % fileBytes
		if err != nil {
			p.res.Err = err
			return
		}
		p.res.Syncs++
		_ = p.res.Latency.RecordValue(min(max(took.Microseconds(), 1), syncMicrosMax)) // in range by construction
		switch {
		case took < p.res.Threshold:
		case len(p.res.Stalls) < stallsMax:
			p.res.Stalls = append(p.res.Stalls, Stall{Start: start, Took: took})
		default:
			p.res.StallsDropped++
		}
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
	}
}

func (p *Probe) sync(buf []byte, off int64) error {
	if _, err := p.f.WriteAt(buf, off); err != nil {
		return fmt.Errorf("diskprobe: write: %w", err)
	}
	if err := fdatasync(p.f); err != nil {
		return fmt.Errorf("diskprobe: sync: %w", err)
	}
	return nil
}

// Stop ends the probe, removes its file and returns what it saw. A sync in
// progress is waited for, so that a stall is recorded whole: Stop returns
// no sooner than the disk does.
func (p *Probe) Stop() *Result {
	close(p.stop)
	<-p.done
	name := p.f.Name()
	cerr := p.f.Close()
	rerr := os.Remove(name)
	res := p.res
	res.Err = errors.Join(res.Err, cerr, rerr)
	return &res
}
