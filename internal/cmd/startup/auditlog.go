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
	// auditFlushInterval is how long the writer waits, once a line has
	// come, for more to share its writes: the longest a line waits. The
	// lines of a busy moment are written together (about 15 to a write,
	// at 250 bytes a line), and the writer wakes once per batch, not per
	// line: waking a parked goroutine can take a system call (a futex) as
	// a write does. What a line costs: docs/benchmarks.md.
	auditFlushInterval = 50 * time.Millisecond
)

// AuditLog is a logger whose lines are formatted and written by a
// goroutine of its own, in batches: a caller hands over a record and goes
// on, and the writer writes what came within auditFlushInterval of the
// first, several lines a write. The queue is bounded: when it is full a
// line is dropped, counted (Dropped), and the drops are said in a line of
// their own at the next write. Close writes what is queued.
type AuditLog struct {
	*slog.Logger
	mu      sync.Mutex
	pending []auditLine // queued, at most auditQueueLenMax
	closed  bool
	wake    chan struct{} // capacity 1: a batch has begun
	dropped atomic.Int64  // all the lines dropped

	// The writer's alone:
	w    io.Writer
	buf  bytes.Buffer // lines formatted, not yet written
	base slog.Handler // writes into buf
	said int64        // of dropped, those already said
	done chan struct{}
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
	a := &AuditLog{w: w, wake: make(chan struct{}, 1), done: make(chan struct{})}
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
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		a.signal()
	}
	a.mu.Unlock()
	<-a.done
}

// signal wakes the writer, if it is not awake already.
func (a *AuditLog) signal() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// queue hands l to the writer, or drops it; never waits but for the
// lock, held for an append.
func (a *AuditLog) queue(l auditLine) {
	a.mu.Lock()
	if a.closed || len(a.pending) >= auditQueueLenMax {
		a.mu.Unlock()
		a.dropped.Add(1)
		return
	}
	a.pending = append(a.pending, l)
	first := len(a.pending) == 1
	a.mu.Unlock()
	if first {
		a.signal()
	}
}

// run writes batches until Close: woken by a batch's first line, it waits
// auditFlushInterval for the rest, takes them all and writes them.
func (a *AuditLog) run() {
	defer close(a.done)
	var batch []auditLine
	for {
		<-a.wake
		a.mu.Lock()
		closed := a.closed
		a.mu.Unlock()
		if !closed {
			time.Sleep(auditFlushInterval)
		}
		a.mu.Lock()
		batch, a.pending = a.pending, batch[:0]
		closed = a.closed
		a.mu.Unlock()
		for i := range batch {
			a.format(batch[i])
			batch[i] = auditLine{} // the records' attributes go with the batch
		}
		a.flush()
		if closed {
			return
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
		a.format(auditLine{h: a.base, r: r})
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
// never waits for the writer.
func (h auditHandler) Handle(_ context.Context, r slog.Record) error {
	h.a.queue(auditLine{h: h.inner, r: r.Clone()})
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
