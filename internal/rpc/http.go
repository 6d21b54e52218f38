package rpc

import (
	"net"
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
