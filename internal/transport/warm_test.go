package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveWarm serves h through Warm on a real h2c listener and returns its
// base URL and the pool.
func serveWarm(t *testing.T, h http.Handler, idleMax int) (string, *warmPool) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := Warm(h, idleMax).(*warmPool)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, lis, p) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	return "http://" + lis.Addr().String(), p
}

func (p *warmPool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	res, err := c.Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, ""
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("GET %s: reading the body: %v", url, err)
	}
	return res.StatusCode, string(b)
}

// TestWarm_ReusesAndBounds: calls one after another are served by one
// kept goroutine, each call gets its own answer when many run at once,
// and no more than idleMax goroutines are kept after a burst.
func TestWarm_ReusesAndBounds(t *testing.T) {
	const idleMax, burst = 5, 40
	var hold sync.WaitGroup
	release := make(chan struct{})
	url, p := serveWarm(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			hold.Done()
			<-release
		}
		fmt.Fprintf(w, "answer to %s", r.URL.Query().Get("n"))
	}), idleMax)
	c := NewClient()

	for i := range 50 {
		if code, body := get(t, c, fmt.Sprintf("%s/?n=%d", url, i)); code != http.StatusOK || body != fmt.Sprintf("answer to %d", i) {
			t.Fatalf("call %d = %d %q", i, code, body)
		}
	}
	if n := p.idleCount(); n != 1 {
		t.Errorf("%d goroutines kept after 50 calls in turn, want 1: each call should take the one the last call left", n)
	}

	hold.Add(burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			if code, body := get(t, c, fmt.Sprintf("%s/?hold=1&n=%d", url, i)); code != http.StatusOK || body != fmt.Sprintf("answer to %d", i) {
				t.Errorf("held call %d = %d %q", i, code, body)
			}
		})
	}
	hold.Wait() // every call is in the handler at once: burst goroutines
	if n := p.idleCount(); n != 0 {
		t.Errorf("%d goroutines idle while %d calls run, want 0", n, burst)
	}
	close(release)
	wg.Wait()
	if n := p.idleCount(); n != idleMax {
		t.Errorf("%d goroutines kept after a burst of %d, want idleMax %d", n, burst, idleMax)
	}
}

// TestWarm_EndedCalls: a handler that panics with http.ErrAbortHandler or
// calls runtime.Goexit ends its call as it would without Warm: net/http
// resets the stream at once (neither a panic left on a kept goroutine,
// which would end the process, nor a wait for a goroutine that is gone),
// and the next call is served, on the kept goroutine if it still exists.
func TestWarm_EndedCalls(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func()
	}{
		{"ErrAbortHandler", func() { panic(http.ErrAbortHandler) }},
		{"Goexit", runtime.Goexit},
		{"GoexitThenPanicRecovered", func() {
			// Warm's own recover takes this panic while the Goexit is
			// pending, which still ends the goroutine.
			defer func() { panic("in a deferred call") }()
			runtime.Goexit()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, p := serveWarm(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, "/end") {
					tc.end()
				}
				io.WriteString(w, "ok")
			}), 0)
			c := NewClient()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/end", nil)
			res, err := c.Do(req)
			if err == nil {
				_, err = io.ReadAll(res.Body)
				res.Body.Close()
			}
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the ended call = %v, want its stream reset at once", err)
			}
			if code, body := get(t, c, url+"/"); code != http.StatusOK || body != "ok" {
				t.Errorf("the call after = %d %q", code, body)
			}
			// After a panic the goroutine is kept and serves the next call;
			// after Goexit a new one does. One is kept either way.
			if n := p.idleCount(); n != 1 {
				t.Errorf("%d goroutines kept, want 1", n)
			}
		})
	}
}

// TestWarm_PanicStack: a handler's own panic reaches net/http with the
// stack where it happened, not only the request goroutine's wait, and a
// panic with an error still matches it.
func TestWarm_PanicStack(t *testing.T) {
	errBoom := errors.New("boom")
	h := Warm(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panicInHandler(errBoom) }), 0)
	var got any
	func() {
		defer func() { got = recover() }()
		h.ServeHTTP(nil, nil)
	}()
	if s := fmt.Sprint(got); !strings.Contains(s, "boom") || !strings.Contains(s, "panicInHandler") {
		t.Errorf("the panic raised again = %q, want its value and the handler's stack", s)
	}
	if err, ok := got.(error); !ok || !errors.Is(err, errBoom) {
		t.Errorf("the panic raised again = %T, want an error that is the handler's", got)
	}
}

//go:noinline
func panicInHandler(err error) { panic(err) }

// TestWarm_IdleTimeout: a kept goroutine that serves nothing for the idle
// timeout ends, so a pool whose server stopped is let go.
func TestWarm_IdleTimeout(t *testing.T) {
	p := Warm(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), 0).(*warmPool)
	p.idleTimeout = 50 * time.Millisecond
	before := runtime.NumGoroutine()
	p.ServeHTTP(nil, nil)
	if n := p.idleCount(); n != 1 {
		t.Fatalf("%d goroutines kept after a call, want 1", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.idleCount() != 0 || runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %d kept, %d goroutines (%d before the call); want the kept one ended", p.idleCount(), runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.ServeHTTP(nil, nil) // a new one serves the next call
	if n := p.idleCount(); n != 1 {
		t.Errorf("%d goroutines kept after the next call, want 1", n)
	}
}

// useStack recurses n frames of about 300 bytes each, as a call through
// the API's layers grows its goroutine's stack.
//
//go:noinline
func useStack(n int) byte {
	var buf [256]byte
	buf[n%len(buf)] = byte(n)
	if n == 0 {
		return buf[0]
	}
	return useStack(n-1) + buf[(n+1)%len(buf)]
}

// BenchmarkWarm: a handler called on a new goroutine each time, as
// net/http does, directly and through Warm: one that needs about 20 KB of
// stack (a call through the API's layers) and one that needs almost none
// (what the handoff to a kept goroutine costs).
func BenchmarkWarm(b *testing.B) {
	for _, depth := range []int{64, 0} {
		h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { useStack(depth) })
		for _, c := range []struct {
			name string
			h    http.Handler
		}{{"fresh", h}, {"warm", Warm(h, 0)}} {
			b.Run(fmt.Sprintf("depth=%d/%s", depth, c.name), func(b *testing.B) {
				done := make(chan struct{})
				for b.Loop() {
					go func() {
						c.h.ServeHTTP(nil, nil)
						done <- struct{}{}
					}()
					<-done
				}
			})
		}
	}
}
