package transport

import (
	"bytes"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestServer_ClientStopsReading: a client opens an h2c stream with
// windows wide open, then never reads its socket. The handler streams
// until the socket is full; with writeByteTimeout the server closes the
// connection and the handler's write returns, instead of waiting for good
// with its goroutine and buffers held.
func TestServer_ClientStopsReading(t *testing.T) {
	defer func(d time.Duration) { writeByteTimeout = d }(writeByteTimeout)
	writeByteTimeout = 500 * time.Millisecond

	ended := make(chan error, 1)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		// Bounded: 1 GiB is far beyond any socket's buffers.
		for range 1 << 14 {
			if _, err := w.Write(chunk); err != nil {
				ended <- err
				return
			}
			if err := rc.Flush(); err != nil {
				ended <- err
				return
			}
		}
		ended <- nil
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()

	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A small receive buffer, so the server's writes fill it soon.
	if err := conn.(*net.TCPConn).SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	const window = 1<<31 - 1
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: window}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteWindowUpdate(0, window-65535); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "localhost"}, {":path", "/watch"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing from here on: not even the server's
	// SETTINGS, so it never acknowledges them either.

	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the handler wrote 1 GiB to a client that reads nothing: the test's socket never filled")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler still waits to write 20 s after its client stopped reading: the connection's writes have no bound")
	}
}
