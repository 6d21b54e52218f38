package rpc

import (
	"net"

	"connectrpc.com/connect"
	"net/http"
	"time"
)

// Server timeouts.
const (
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 2 * time.Minute
)

// NewServer returns an HTTP server that speaks HTTP/1.1 and cleartext
// HTTP/2 (h2c) on one port, as Connect, gRPC and gRPC-Web clients need.
func NewServer(h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &p,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
	}
}

// NewClient returns an HTTP client that speaks cleartext HTTP/2 only, with
// prior knowledge: what gRPC needs and what Connect uses between services.
func NewClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	t := &http.Transport{
		Protocols:           &p,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     idleTimeout,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	return &http.Client{Transport: t}
}

// Message bounds of every handler.
const (
	// compressMinBytes: smaller messages go uncompressed. Compressing every
	// small answer cost a tenth of the allocator's CPU under load.
	compressMinBytes = 4096
	// readMaxBytes bounds a message a peer may send.
	readMaxBytes = 4 << 20
)

// HandlerOptions are the options every shardstock handler is built with.
func HandlerOptions() []connect.HandlerOption {
	return []connect.HandlerOption{connect.WithCompressMinBytes(compressMinBytes), connect.WithReadMaxBytes(readMaxBytes)}
}

// InternalClientOptions are the options of clients between shardstock's own
// processes on one network: no compression.
func InternalClientOptions() []connect.ClientOption {
	return []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil), connect.WithReadMaxBytes(readMaxBytes)}
}
