package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/shardstock/shardstock/bench/internal/baseline"
	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/transport"
)

// serveRedisAPIArg, as loadgen's first argument, makes the process the
// redis-api target's server: shardstock's API and handlers over Redis
// (baseline.RedisAPI), `loadgen serve-redis-api -addr 127.0.0.1:0 -redis
// ADDR -prefix P`.
const (
	serveRedisAPIArg   = "serve-redis-api"
	redisAPIKeysPrefix = "loadgen:redis-api:"
)

// serveRedisAPI serves the redis-api target until ctx ends or stdin closes.
func serveRedisAPI(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen "+serveRedisAPIArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (port 0 picks one)")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	prefix := fs.String("prefix", redisAPIKeysPrefix, "prefix of every key")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := baseline.NewRedisAPI(ctx, baseline.RedisAPIConfig{Addr: *redisAddr, Prefix: *prefix})
	if err != nil {
		return err
	}
	defer s.Close()
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("%s: %w", serveRedisAPIArg, err)
	}
	return serveChild(ctx, serveRedisAPIArg, l, stdin, stdout, func(ctx context.Context, l net.Listener) error {
		return transport.Serve(ctx, l, http.Handler(s.Handler()))
	})
}

// redisAPITarget is the Connect-fronted Redis: the shardstock client
// driving a serve-redis-api process, with Redis's append-only file on and
// appendfsync always for the run (put back at Close), so that every
// acknowledged answer is on disk as shardstock's are.
type redisAPITarget struct {
	childTarget
	fsync     *baseline.Redis // turns fsync on, and back, and deletes the run's keys
	redisAddr string
}

var _ loadgen.Target = (*redisAPITarget)(nil)

func newRedisAPITarget(o options) loadgen.Target { return &redisAPITarget{redisAddr: o.redisAddr} }

// Name is "redis-api".
func (t *redisAPITarget) Name() string { return "redis-api" }

// Baseline is true.
func (t *redisAPITarget) Baseline() bool { return true }

// Setup turns fsync on and starts the server on first use, then creates
// the SKUs through the API.
func (t *redisAPITarget) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	if t.fsync == nil {
		t.fsync = baseline.NewRedis(baseline.RedisConfig{Addr: t.redisAddr, Fsync: true})
		if err := t.fsync.Setup(ctx, nil); err != nil {
			return fmt.Errorf("redis-api: %w", err)
		}
	}
	if err := t.start(ctx, serveRedisAPIArg, "-addr", "127.0.0.1:0", "-redis", t.redisAddr,
		"-prefix", t.fsync.Prefix()+"api:"); err != nil {
		return fmt.Errorf("redis-api: %w", err)
	}
	return t.Target.Setup(ctx, skus)
}

// Close stops the server, deletes the run's keys and puts Redis's
// settings back.
func (t *redisAPITarget) Close() error {
	errs := []error{t.childTarget.Close()}
	if t.fsync != nil {
		errs = append(errs, t.fsync.Close())
		t.fsync = nil
	}
	return errors.Join(errs...)
}
