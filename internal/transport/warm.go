package transport

import (
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
)

// WarmIdleMax bounds the idle goroutines Warm keeps between calls.
const WarmIdleMax = 256

// Warm serves each request on a goroutine kept from an earlier one, whose
// stack has already grown to what a call needs. net/http starts every
// HTTP/2 stream's handler on a new goroutine with the smallest stack, and
// a call through Connect, the API's handlers and a shard's writer grows
// it several times, each a copy of every frame (runtime.copystack was 6%
// to 10% of the allocator's CPU under load). The request's own goroutine
// waits for the call, so the ResponseWriter is used while ServeHTTP is
// still running, as net/http requires; a panic is carried back and raised
// there, where net/http handles it as it would have. At most idleMax
// goroutines wait between calls (WarmIdleMax if idleMax <= 0); beyond
// them, a goroutine ends after its call.
func Warm(h http.Handler, idleMax int) http.Handler {
	if idleMax <= 0 {
		idleMax = WarmIdleMax
	}
	p := &warmPool{h: h, idleMax: idleMax}
	return p
}

type warmPool struct {
	h       http.Handler
	idleMax int
	mu      sync.Mutex
	idle    []*warmWorker // LIFO: the most recently used stack is the warmest
}

type warmWorker struct {
	calls chan warmCall
	done  chan any // the call's panic value, or nil
}

type warmCall struct {
	w    http.ResponseWriter
	r    *http.Request
	done chan any // the worker's
}

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
	wk.calls <- warmCall{w, r, wk.done}
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

// warmGoexit is sent for a handler that called runtime.Goexit.
var warmGoexit = new(struct{ goexit bool })

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

func (p *warmPool) work(wk *warmWorker) {
	for c := range wk.calls {
		wk.done <- p.serve(c)
	}
}

func (p *warmPool) serve(c warmCall) (panicked any) {
	returned := false
	defer func() {
		switch v := recover(); {
		case v != nil:
			panicked = v
			if v != http.ErrAbortHandler { // net/http ends that one quietly
				panicked = warmPanic{v: v, stack: debug.Stack()}
			}
		case !returned:
			// runtime.Goexit: this goroutine ends after the defers, and
			// the request's goroutine must not wait for it.
			c.done <- warmGoexit
		}
	}()
	p.h.ServeHTTP(c.w, c.r)
	returned = true
	return nil
}

// warmPanic is a handler's panic raised again on the request's goroutine,
// with the stack of the kept goroutine where it happened (net/http logs
// the value with %v, then the request goroutine's own stack).
type warmPanic struct {
	v     any
	stack []byte
}

func (p warmPanic) String() string {
	return fmt.Sprintf("%v\n\nraised on a kept goroutine (transport.Warm):\n%s", p.v, p.stack)
}
