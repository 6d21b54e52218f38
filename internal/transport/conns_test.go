package transport

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// serveLimited serves "ok" over h2c on a listener bounded to max
// connections, until the test ends.
func serveLimited(t testing.TB, max int) (url string, m ConnMetrics) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m = NewConnMetrics(prometheus.NewRegistry(), "test")
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	go func() { served <- Serve(ctx, LimitConns(lis, max, m), h) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	return "http://" + lis.Addr().String(), m
}

// callOK calls url on its own h2c connection (one client, one connection).
func callOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if string(body) != "ok" {
		return fmt.Errorf("body %q", body)
	}
	return nil
}

// TestLimitConns: with two connections held, a third is reset at once
// (not left waiting) and counted; once one of the two is closed, a new
// connection is served. Real h2c clients, each with its own connection.
func TestLimitConns(t *testing.T) {
	url, m := serveLimited(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	held := []*http.Client{NewClient(), NewClient()}
	for i, c := range held {
		if err := callOK(ctx, c, url); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if got := testutil.ToFloat64(m.Open); got != 2 {
		t.Fatalf("open connections = %v, want 2", got)
	}

	third := NewClient()
	defer third.CloseIdleConnections()
	start := time.Now()
	if err := callOK(ctx, third, url); err == nil {
		t.Fatal("a third connection was served over a bound of 2")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the refused connection took %s to fail, want it at once", took)
	}
	if got := testutil.ToFloat64(m.Refused); got < 1 {
		t.Errorf("refused = %v, want at least 1", got)
	}

	// The server closes its side when the client's connection goes; the
	// place is free then.
	held[0].CloseIdleConnections()
	for {
		err := callOK(ctx, third, url)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no connection served after one of two closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := testutil.ToFloat64(m.Open); got != 2 {
		t.Errorf("open connections = %v, want 2 (the second and the third's)", got)
	}
	held[1].CloseIdleConnections()
}

// TestLimitConns_HalfClose: an accepted connection still half-closes
// (net/http's CloseWrite before closing an HTTP/1.1 connection, so that
// the client reads the whole response): the peer reads EOF while the
// connection stays open for what it sends.
func TestLimitConns_HalfClose(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limited := LimitConns(lis, 1, NewConnMetrics(prometheus.NewRegistry(), "test"))
	defer limited.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := limited.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	cw, ok := server.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("the accepted connection (%T) cannot half-close: net/http would skip its CloseWrite", server)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := client.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("the client read %d bytes, %v after the server's CloseWrite, want EOF", n, err)
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatalf("the client's write after a half-close: %v", err)
	}
	buf := make([]byte, 1)
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(server, buf); err != nil || buf[0] != 'x' {
		t.Errorf("the server read %q, %v after its half-close, want x", buf, err)
	}
}

// BenchmarkIdleConnMemory reports the memory one idle h2c connection holds,
// client and server together (both are in this process, so this is an
// upper bound on the server's share): what -max-client-conns bounds.
func BenchmarkIdleConnMemory(b *testing.B) {
	const conns = 500
	url, _ := serveLimited(b, conns)
	ctx := context.Background()
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		clients := make([]*http.Client, conns)
		for i := range clients {
			clients[i] = NewClient()
			if err := callOK(ctx, clients[i], url); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		used := (after.HeapInuse + after.StackInuse) - (before.HeapInuse + before.StackInuse)
		b.ReportMetric(float64(used)/conns, "bytes/conn")
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}
}
