// Package etcdembed runs an embedded single-member etcd on 127.0.0.1 (or an
// address given), for local development (`make run`) and for tests
// (internal/etcdtest wraps it). It imports no testing code, so that
// commands may link it.
package etcdembed

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

const (
	// readyTimeout bounds the wait for the server to serve (about 110 ms normally).
	readyTimeout = 20 * time.Second
	// dialTimeout bounds the client's first connection.
	dialTimeout = 5 * time.Second
	// loopback is the address a server listens on unless StartHost says.
	loopback = "127.0.0.1"
	// memberName names the single member in its initial cluster.
	memberName = "etcdembed"
)

// Server is a running embedded etcd server with a client connected to it.
type Server struct {
	server    *embed.Etcd
	client    *clientv3.Client
	endpoints []string
	dir       string
	host      string // the address it listens on
	removeDir bool
	closeOnce sync.Once
}

// Start starts a server with its data in dir (reused if it already
// holds some) and returns once it serves clients, within readyTimeout or
// until ctx ends. An empty dir means a new temporary directory, removed by
// Close. fsync is off: fine for tests and local development only.
func Start(ctx context.Context, dir string) (*Server, error) {
	return StartHost(ctx, dir, loopback)
}

// StartHost is Start with the server listening on the IPv4 address host
// (one of this network namespace's) instead of 127.0.0.1.
func StartHost(ctx context.Context, dir, host string) (*Server, error) {
	e := &Server{dir: dir, host: host}
	if e.dir == "" {
		var err error
		if e.dir, err = os.MkdirTemp("", "etcdembed-"); err != nil {
			return nil, fmt.Errorf("etcdembed: %w", err)
		}
		e.removeDir = true
	}
	if err := e.start(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Endpoints returns the client URLs, e.g. http://127.0.0.1:43127.
func (e *Server) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// Client returns a client connected to the server, closed by Close.
func (e *Server) Client() *clientv3.Client { return e.client }

// Close closes the client, stops the server and removes the directory if
// Start created it. It is safe to call more than once.
func (e *Server) Close() {
	e.closeOnce.Do(func() {
		if e.client != nil {
			e.client.Close()
		}
		if e.server != nil {
			e.server.Close()
		}
		if e.removeDir {
			os.RemoveAll(e.dir)
		}
	})
}

// start launches the server, waits until it is ready and connects a client.
func (e *Server) start(ctx context.Context) error {
	cfg, err := config(e.dir, e.host)
	if err != nil {
		return err
	}
	if e.server, err = embed.StartEtcd(cfg); err != nil {
		return fmt.Errorf("etcdembed: start: %w", err)
	}
	if err := e.waitReady(ctx); err != nil {
		return err
	}
	for _, l := range e.server.Clients {
		e.endpoints = append(e.endpoints, "http://"+l.Addr().String())
	}
	e.client, err = clientv3.New(clientv3.Config{
		Endpoints:   e.endpoints,
		DialTimeout: dialTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("etcdembed: client: %w", err)
	}
	return nil
}

// waitReady waits until the server has joined its one-member cluster and
// serves, it fails, readyTimeout passes, or ctx ends.
func (e *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	select {
	case <-e.server.Server.ReadyNotify():
		return nil
	case err := <-e.server.Err():
		return fmt.Errorf("etcdembed: server failed during start: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("etcdembed: server not ready: %w", ctx.Err())
	}
}

// config returns a quiet single-member configuration on host, on ports
// picked by the kernel, with data in dir.
func config(dir, host string) (*embed.Config, error) {
	// Port 0 lets the kernel pick a free port; the real one is read back
	// from the listener, so concurrent servers never collide.
	anyPort := "http://" + net.JoinHostPort(host, "0")
	u, err := url.Parse(anyPort)
	if err != nil {
		return nil, fmt.Errorf("etcdembed: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = memberName
	cfg.Dir = dir
	cfg.ListenPeerUrls = []url.URL{*u}
	cfg.AdvertisePeerUrls = []url.URL{*u}
	cfg.ListenClientUrls = []url.URL{*u}
	cfg.AdvertiseClientUrls = []url.URL{*u}
	cfg.InitialCluster = memberName + "=" + anyPort
	cfg.LogLevel = "panic" // shutdown otherwise logs expected errors at warn and error
	cfg.UnsafeNoFsync = true
	return cfg, nil
}
