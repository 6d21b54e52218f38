package transport

import (
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"
)

const (
	// WarmIdleMax bounds the idle goroutines Warm keeps between calls.
	WarmIdleMax = 256
	// warmIdleTimeout ends a goroutine that served no call for this long,
	// so that a pool no longer called (its server stopped) is let go.
	warmIdleTimeout = 30 * time.Second
)

// Warm serves each request on a goroutine kept from an earlier one, whose
// stack has already grown to what a call needs. net/http starts every
// HTTP/2 stream's handler on a new goroutine with the smallest stack, and
// a call through Connect, the API's handlers and a shard's writer grows
// it several times, each a copy of every frame (runtime.copystack's share
// of the allocator's CPU: docs/benchmarks.md). The request's own goroutine
// waits for the call, so the ResponseWriter is used while ServeHTTP is
// still running, as net/http requires; a panic is carried back and raised
// there, where net/http handles it as it would have, and a runtime.Goexit
// ends the request's goroutine too. At most idleMax goroutines wait
// between calls (WarmIdleMax if idleMax <= 0), each for at most 30 s;
// beyond them, a goroutine ends after its call.
//
// A kept goroutine carries goroutine-local state from call to call: the
// pprof labels of the request that started it, and whatever a handler
// leaves set (labels, a locked OS thread). shardstock's handlers set none.
func Warm(h http.Handler, idleMax int) http.Handler {
	if idleMax <= 0 {
		idleMax = WarmIdleMax
	}
	return &warmPool{h: h, idleMax: idleMax, idleTimeout: warmIdleTimeout}
}

type warmPool struct {
	h           http.Handler
	idleMax     int
	idleTimeout time.Duration
	mu          sync.Mutex
	idle        []*warmWorker // LIFO: the most recently used stack is the warmest
}

type warmWorker struct {
	calls chan warmCall
	done  chan any // buffered 1: nil, the call's panic, or warmGoexit
}

type warmCall struct {
	w http.ResponseWriter
	r *http.Request
}

// warmGoexit is sent for a handler that called runtime.Goexit.
var warmGoexit = new(struct{ goexit bool })

func (p *warmPool) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	var wk *warmWorker
	if n := len(p.idle); n > 0 {
		wk = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if wk == nil {
		wk = &warmWorker{calls: make(chan warmCall), done: make(chan any, 1)}
		go p.work(wk)
	}
	wk.calls <- warmCall{w, r}
	switch v := <-wk.done; v {
	case nil:
		p.release(wk)
	case warmGoexit:
		// The handler called runtime.Goexit, which ended the kept
		// goroutine; end this one so, as the handler would have.
		runtime.Goexit()
	default:
		p.release(wk)
		panic(v)
	}
}

// release puts wk back among the idle, or ends it if enough wait.
func (p *warmPool) release(wk *warmWorker) {
	p.mu.Lock()
	if len(p.idle) < p.idleMax {
		p.idle = append(p.idle, wk)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	close(wk.calls)
}

// work serves wk's calls until it is let go: its calls closed, or idle for
// idleTimeout.
func (p *warmPool) work(wk *warmWorker) {
	// A handler's runtime.Goexit ends this goroutine in the middle of a
	// call, even one whose deferred calls panic and recover: the request's
	// goroutine is told here, where Goexit cannot be missed.
	ended := false
	defer func() {
		if !ended {
			wk.done <- warmGoexit
		}
	}()
	timer := time.NewTimer(p.idleTimeout)
	defer timer.Stop()
	for {
		select {
		case c, ok := <-wk.calls:
			if !ok {
				ended = true
				return
			}
			wk.done <- p.serve(c)
			timer.Reset(p.idleTimeout)
		case <-timer.C:
			p.mu.Lock()
			i := slices.Index(p.idle, wk)
			if i >= 0 {
				p.idle = slices.Delete(p.idle, i, i+1)
			}
			p.mu.Unlock()
			if i >= 0 {
				ended = true
				return
			}
			// Taken just now: its call is on the way.
		}
	}
}

func (p *warmPool) serve(c warmCall) (panicked any) {
	defer func() {
		if v := recover(); v != nil {
			panicked = v
			if v != http.ErrAbortHandler { // net/http ends that one quietly
				panicked = &warmPanic{v: v, stack: debug.Stack()}
			}
		}
	}()
	p.h.ServeHTTP(c.w, c.r)
	return nil
}

// warmPanic is a handler's panic raised again on the request's goroutine,
// with the stack of the kept goroutine where it happened (net/http logs
// the value with %v, then the request goroutine's own stack). It is an
// error that unwraps to the panic's value when that is one.
type warmPanic struct {
	v     any
	stack []byte
}

func (p *warmPanic) Error() string {
	return fmt.Sprintf("%v\n\nraised on a kept goroutine (transport.Warm):\n%s", p.v, p.stack)
}

func (p *warmPanic) Unwrap() error {
	err, _ := p.v.(error)
	return err
}
