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
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	"github.com/shardstock/shardstock/internal/transport"
)

// serveRedisAPIArg, as loadgen's first argument, makes the process the
// redis-api target's server: shardstock's API and handlers over Redis
// (baseline.RedisAPI), `loadgen serve-redis-api -addr 127.0.0.1:0 -redis
// ADDR -prefix P`.
const (
	serveRedisAPIArg   = "serve-redis-api"
	redisAPIName       = loadgen.FrontedRedisTarget
	redisAPIBareName   = "redis-api-bare"
	redisAPIKeysPrefix = "loadgen:redis-api:"
)

// serveRedisAPI serves the redis-api target until ctx ends or stdin closes.
func serveRedisAPI(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen "+serveRedisAPIArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (port 0 picks one)")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	prefix := fs.String("prefix", redisAPIKeysPrefix, "prefix of every key")
	adminToken := fs.String("admin-token", "", "with -service-token, serve behind the allocator's front (baseline.RedisAPI.Handler)")
	serviceToken := fs.String("service-token", "", "the service role's bearer token of the front")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := baseline.NewRedisAPI(ctx, baseline.RedisAPIConfig{Addr: *redisAddr, Prefix: *prefix, AdminToken: *adminToken, ServiceToken: *serviceToken})
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
// acknowledged answer is on disk as shardstock's are. redis-api serves
// behind the allocator's front (tokens, admission, call metrics); redis-api-bare
// without it, as this target was measured up to 2026-12-06.
type redisAPITarget struct {
	childTarget
	fsync     *baseline.Redis // turns fsync on, and back, and deletes the run's keys
	redisAddr string
	bare      bool
}

var _ loadgen.Target = (*redisAPITarget)(nil)

func newRedisAPITarget(o options) loadgen.Target { return &redisAPITarget{redisAddr: o.redisAddr} }

func newRedisAPIBareTarget(o options) loadgen.Target {
	return &redisAPITarget{redisAddr: o.redisAddr, bare: true}
}

// Name is "redis-api", or "redis-api-bare" without the front.
func (t *redisAPITarget) Name() string {
	if t.bare {
		return redisAPIBareName
	}
	return redisAPIName
}

// Baseline is true.
func (t *redisAPITarget) Baseline() bool { return true }

// Setup turns fsync on and starts the server on first use, then creates
// the SKUs through the API.
func (t *redisAPITarget) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	if t.fsync == nil {
		t.fsync = baseline.NewRedis(baseline.RedisConfig{Addr: t.redisAddr, Fsync: true})
		if err := t.fsync.Setup(ctx, nil); err != nil {
			return fmt.Errorf("%s: %w", t.Name(), err)
		}
	}
	args := []string{serveRedisAPIArg, "-addr", "127.0.0.1:0", "-redis", t.redisAddr, "-prefix", t.fsync.Prefix() + "api:"}
	var tokens shardstock.Config
	if !t.bare {
		tokens.AdminToken, tokens.ServiceToken = randomHex(16), randomHex(16)
		args = append(args, "-admin-token", tokens.AdminToken, "-service-token", tokens.ServiceToken)
	}
	if err := t.startWith(ctx, tokens, args...); err != nil {
		return fmt.Errorf("%s: %w", t.Name(), err)
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
