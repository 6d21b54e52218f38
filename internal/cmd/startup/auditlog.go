package startup

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of an AuditLog.
const (
	// auditQueueLenMax bounds the lines waiting to be written: a record
	// holds a handful of attributes, under 1 KiB, so at most a few MiB.
	// A burst longer than the writer keeps up with drops lines (counted,
	// and said) rather than holding a request.
	auditQueueLenMax = 4096
	// auditWriteBytesMax is the most written at once: PIPE_BUF, the most
	// a pipe (a container runtime's log pipe) writes without
	// interleaving it with the lines of the process's other logger.
	auditWriteBytesMax = 4096
	// auditFlushInterval is the longest a line waits to be written: the
	// lines of a busy moment share a write (about 15 to a write, at 250
	// bytes a line) where a write each would cost a system call each.
	auditFlushInterval = 50 * time.Millisecond
)

// AuditLog is a logger whose lines are formatted and written by a
// goroutine of its own, several lines a write, each within
// auditFlushInterval: a caller hands over a record and goes on (a write a line cost a stock call tens of
// microseconds of its server's CPU, docs/benchmarks.md). The queue is
// bounded: when it is full a line is dropped, counted (Dropped), and the
// drops are said in a line of their own once the queue has room again.
// Close writes what is queued.
type AuditLog struct {
	*slog.Logger
	queue    chan auditLine
	dropped  atomic.Int64 // all the lines dropped
	said     int64        // of dropped, those already said (the writer's)
	w        io.Writer
	buf      bytes.Buffer // lines formatted, not yet written (the writer's)
	base     slog.Handler // writes into buf
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// auditLine is a queued record and the handler (with its attributes) to
// format it with.
type auditLine struct {
	h slog.Handler
	r slog.Record
}

// NewAuditLog returns an AuditLog writing to w at level in format (as
// Logger), until Close.
func NewAuditLog(w io.Writer, level, format string) (*AuditLog, error) {
	a := &AuditLog{queue: make(chan auditLine, auditQueueLenMax), w: w, stop: make(chan struct{}), done: make(chan struct{})}
	base, err := logHandler(&a.buf, level, format)
	if err != nil {
		return nil, err
	}
	a.base = base
	a.Logger = slog.New(auditHandler{a: a, inner: base})
	go a.run()
	return a, nil
}

// Dropped is the number of lines dropped because the queue was full.
func (a *AuditLog) Dropped() int64 { return a.dropped.Load() }

// Close writes the lines queued and stops the writer; lines logged after
// it are dropped.
func (a *AuditLog) Close() {
	a.stopOnce.Do(func() { close(a.stop) })
	<-a.done
}

// run formats the queued lines and writes them auditFlushInterval after
// the first of them, until Close.
func (a *AuditLog) run() {
	defer close(a.done)
	timer := time.NewTimer(auditFlushInterval)
	timer.Stop()
	armed := false
	for {
		select {
		case l := <-a.queue:
			a.format(l)
			if !armed {
				timer.Reset(auditFlushInterval)
				armed = true
			}
		case <-timer.C:
			armed = false
			a.flush()
		case <-a.stop:
			timer.Stop()
			for {
				select {
				case l := <-a.queue:
					a.format(l)
				default:
					a.flush()
					return
				}
			}
		}
	}
}

// format formats a line into buf, first writing the lines before it if it
// would take buf past auditWriteBytesMax.
func (a *AuditLog) format(l auditLine) {
	before := a.buf.Len()
	_ = l.h.Handle(context.Background(), l.r) // into buf: cannot fail
	if a.buf.Len() <= auditWriteBytesMax || before == 0 {
		return
	}
	line := bytes.Clone(a.buf.Bytes()[before:])
	a.buf.Truncate(before)
	a.write()
	a.buf.Write(line)
}

// flush says the lines dropped since last said, then writes buf.
func (a *AuditLog) flush() {
	if n := a.dropped.Load(); n > a.said {
		r := slog.NewRecord(time.Now(), slog.LevelWarn, "audit lines dropped: more stock calls than the log writer kept up with", 0)
		r.AddAttrs(slog.Int64("dropped", n-a.said), slog.Int64("dropped_total", n))
		_ = a.base.Handle(context.Background(), r)
		a.said = n
	}
	a.write()
}

// write writes buf in one write, and empties it.
func (a *AuditLog) write() {
	if a.buf.Len() > 0 {
		_, _ = a.w.Write(a.buf.Bytes()) // a log that cannot be written has nowhere to say so
		a.buf.Reset()
	}
}

// auditHandler queues records for the AuditLog's writer.
type auditHandler struct {
	a     *AuditLog
	inner slog.Handler // formats into a.buf, in the writer's goroutine only
}

func (h auditHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// Handle queues r, or drops it if the queue is full or the log closed:
// never waits.
func (h auditHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case <-h.a.stop:
		h.a.dropped.Add(1)
		return nil
	default:
	}
	select {
	case h.a.queue <- auditLine{h: h.inner, r: r.Clone()}:
	default:
		h.a.dropped.Add(1)
	}
	return nil
}

// WithAttrs and WithGroup derive the inner handler; deriving writes
// nothing, so it is safe outside the writer's goroutine.
func (h auditHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return auditHandler{a: h.a, inner: h.inner.WithAttrs(attrs)}
}

func (h auditHandler) WithGroup(name string) slog.Handler {
	return auditHandler{a: h.a, inner: h.inner.WithGroup(name)}
}
