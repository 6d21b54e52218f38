package transport

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestNewInternalClient_StoppedPeer: a peer that accepts the connection
// (the kernel does, for a stopped process) and then answers nothing is
// found by the keep-alive pings, long before the call's own deadline.
func TestNewInternalClient_StoppedPeer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			accepted <- c // held open, never read nor written
		}
	}()
	defer func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	}()

	const deadline = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lis.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := NewInternalClient().Do(req)
	took := time.Since(start)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("Do to a silent peer = %s, want an error", resp.Status)
	}
	if ctx.Err() != nil {
		t.Fatalf("Do to a silent peer waited for the call's deadline (%s): %v", took, err)
	}
	t.Logf("silent peer found after %s (pings: %s idle, %s timeout): %v", took.Round(time.Millisecond), pingIdleTimeout, pingTimeout, err)
}
