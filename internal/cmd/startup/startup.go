// Package startup is what shardstock's commands do as they start: configuration from flags
// over environment over defaults, logging, and listening.
package startup

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Env returns getenv(name), or def when it is empty: a flag's default, so
// that a flag given on the command line wins over the environment.
func Env(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// Logger returns a text logger at level ("debug", "info", "warn", "error").
func Logger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// Listen listens on addr (host:port; port 0 picks one).
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}

// etcdDialTimeout bounds connecting to etcd.
const etcdDialTimeout = 5 * time.Second

// Etcd connects to comma-separated etcd endpoints.
func Etcd(endpoints string) (*clientv3.Client, error) {
	eps := strings.Split(endpoints, ",")
	if endpoints == "" || len(eps) == 0 {
		return nil, fmt.Errorf("no etcd endpoints: set -etcd-endpoints or ETCD_ENDPOINTS")
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: etcdDialTimeout, Logger: nopLogger()})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", endpoints, err)
	}
	return c, nil
}
