// Package transport is how shardstock's Connect services travel: the HTTP/2
// servers and clients with their timeouts and pings, the mux with health,
// reflection, metrics and pprof, and the interceptor that counts calls.
// What the messages mean is in internal/wire and internal/api.
package transport

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Server timeouts and bounds.
const (
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 2 * time.Minute
	// headerMaxBytes bounds a request's headers on every listener.
	headerMaxBytes = 64 << 10
)

// writeByteTimeout closes an HTTP/2 connection on which nothing could be
// written for this long while there was something to write: a client
// that stops reading its socket. A stream's own bounds (a watch's send
// deadline, api.WatchWriter) end its handler, but their reset cannot go
// out through a full socket, and the connection's writer would wait
// forever. 30 s is a watch's send bound: a client that reads at all
// takes bytes within milliseconds. A variable for the test.
var writeByteTimeout = 30 * time.Second

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
		MaxHeaderBytes:    headerMaxBytes,
		HTTP2:             &http.HTTP2Config{WriteByteTimeout: writeByteTimeout},
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

// HTTP/2 keep-alive pings between shardstock's own processes
// (NewInternalClient). A peer that is stopped (SIGSTOP), hung or cut off
// keeps its TCP connection open and answers nothing; without pings every
// call on the connection waits for its whole deadline (10 s), and so do
// the callers whose ops it carries.
const (
	// pingIdleTimeout: a connection that has received no frame for this
	// long sends a ping. Under load frames arrive every few milliseconds
	// and no ping is sent; an idle connection costs one small frame a
	// second.
	pingIdleTimeout = time.Second
	// pingTimeout: a ping unanswered for this long closes the connection,
	// failing its calls (SHARD_UNAVAILABLE, retry with the same key) and
	// counting against the peer's circuit breaker. A Go HTTP/2 server
	// answers pings from its connection's read loop, not its handlers, so
	// a live server busy with slow handlers still answers within
	// milliseconds; 2 s is far beyond the scheduling delays of a loaded
	// 2-core machine, so a live peer is not cut off, while a stopped one
	// is found within pingIdleTimeout + pingTimeout = 3 s of its last
	// frame, before the default 5 s lease hands its partitions over.
	pingTimeout = 2 * time.Second
)

// NewInternalTLSClient is NewInternalClient over TLS (HTTP/2 by ALPN) with
// files' certificate and CA as they are when each connection is made: for
// shard servers that require a client certificate.
func NewInternalTLSClient(files *CertFiles) *http.Client {
	var p http.Protocols
	p.SetHTTP2(true)
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		Protocols:           &p,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     idleTimeout,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			d := tls.Dialer{NetDialer: dialer, Config: files.ClientConfig(host)}
			return d.DialContext(ctx, network, addr)
		},
		HTTP2: &http.HTTP2Config{SendPingTimeout: pingIdleTimeout, PingTimeout: pingTimeout},
	}
	return &http.Client{Transport: t}
}

// RequireClientCert wraps h so that calls of the services under prefixes
// need a verified client certificate (a TLS config with
// tls.VerifyClientCertIfGiven checked it); health, readiness, metrics and
// the other plain paths stay open, for probes that have no certificate.
func RequireClientCert(h http.Handler, prefixes ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range prefixes {
			if strings.HasPrefix(r.URL.Path, p) && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
				http.Error(w, "a client certificate is required", http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// NewInternalClient is NewClient with HTTP/2 keep-alive pings, for calls
// between shardstock's own processes (the allocator to shard servers).
func NewInternalClient() *http.Client {
	c := NewClient()
	c.Transport.(*http.Transport).HTTP2 = &http.HTTP2Config{
		SendPingTimeout: pingIdleTimeout,
		PingTimeout:     pingTimeout,
	}
	return c
}

// Message bounds of every handler.
const (
	// compressMinBytes: smaller messages go uncompressed. Compressing every
	// small answer cost a tenth of the allocator's CPU under load.
	compressMinBytes = 4096
	// readMaxBytes bounds a message a peer may send between shardstock's
	// own processes (an Execute call carries up to 4,096 operations).
	readMaxBytes = 4 << 20
	// PublicReadMaxBytes bounds a message of the public and admin APIs,
	// after decompression: every request is one SKU's, well under 1 KiB.
	// A larger one is resource_exhausted and reaches no handler.
	PublicReadMaxBytes = 64 << 10
)

// HandlerOptions are the options of the internal ShardService's handlers.
func HandlerOptions() []connect.HandlerOption {
	return []connect.HandlerOption{connect.WithCompressMinBytes(compressMinBytes), connect.WithReadMaxBytes(readMaxBytes)}
}

// PublicHandlerOptions are the options of the public and admin APIs'
// handlers: HandlerOptions with the smaller message bound.
func PublicHandlerOptions() []connect.HandlerOption {
	return []connect.HandlerOption{connect.WithCompressMinBytes(compressMinBytes), connect.WithReadMaxBytes(PublicReadMaxBytes)}
}

// InternalClientOptions are the options of clients between shardstock's own
// processes on one network: no compression.
func InternalClientOptions() []connect.ClientOption {
	return []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil), connect.WithReadMaxBytes(readMaxBytes)}
}
