// Package shardcmd is the shard server command: flags and environment, wiring,
// serving and shutdown. cmd/shard and the dev stack run it.
package shardcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"

	"github.com/shardstock/shardstock/internal/cmd/startup"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/shardnode"
	"github.com/shardstock/shardstock/internal/transport"
)

// Run runs the command until ctx ends; args are the command-line arguments
// without the program name.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	if err := shardnode.CheckGroupDelay(cfg.groupDelay); err != nil {
		return err
	}
	log, err := startup.Logger(stderr, cfg.level, cfg.format)
	if err != nil {
		return err
	}
	tlsCfg, err := startup.TLSConfig(cfg.tlsCert, cfg.tlsKey, cfg.clientCA, log)
	if err != nil {
		return err
	}
	dbs, err := startup.Databases(cfg.stores.DatabaseURL, cfg.stores.MoreDatabases)
	if err != nil {
		return err
	}
	if cfg.id == "" {
		return errors.New("no server id: set -id or SHARDSTOCK_SERVER_ID")
	}

	dbOpts, err := startup.WithMigrateURLs(postgres.Options{MaxConns: int32(cfg.maxConns), ApplicationName: "shardstock-shard-" + cfg.id}, dbs, cfg.stores.MigrateURL, cfg.stores.MigrateDatabases)
	if err != nil {
		return err
	}
	proc, err := startup.Open(ctx, dbs, dbOpts, cfg.stores.Etcd, cfg.addr, log)
	if err != nil {
		return err
	}
	defer proc.Close()
	client, lis, reg := proc.Etcd, proc.Listener, proc.Registry
	if err := shardnode.CheckDurabilityAll(ctx, proc.DBs, cfg.requireSync, log); err != nil {
		return err
	}
	if cfg.advertise == "" {
		cfg.advertise = lis.Addr().String()
	}

	// Shut down in reverse: stop serving, leave the topology (others take
	// the partitions at once), stop the writers, close the database.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The node joins the topology only once etcd is past the databases'
	// fences (restored or rebuilt, it may be behind them).
	node := shardnode.New(shardnode.Config{ID: cfg.id, Advertise: cfg.advertise, DBs: proc.DBs, Etcd: client, LeaseTTL: cfg.leaseTTL, Logger: log, Registry: reg,
		GroupDelay: cfg.groupDelay, EtcdCheck: startup.CheckEtcd(ctx, proc.DBs, client, log)})
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- node.Run(ctx) }()
	fmt.Fprintf(stdout, "shard %s listening on %s\n", cfg.id, lis.Addr())
	go readiness.Announce(ctx, stdout, readiness.Line{Role: readiness.RoleShard, ID: cfg.id, Addr: startup.Scheme(tlsCfg) + "://" + lis.Addr().String()}, node.Ready)
	log.Info("shard server started", "id", cfg.id, "addr", lis.Addr().String(), "advertise", cfg.advertise)
	// With -operator-addr, /metrics and /debug/pprof/ are served there
	// only: the shard port is then for allocators alone.
	gatherer, opsDone := prometheus.Gatherer(reg), make(chan error, 1)
	if cfg.operatorAddr == "" {
		opsDone <- nil
	} else {
		opsLis, err := startup.Listen(ctx, cfg.operatorAddr)
		if err != nil {
			cancel()
			return errors.Join(fmt.Errorf("-operator-addr: %w", err), <-nodeDone)
		}
		gatherer = nil
		go func() {
			opsDone <- transport.Serve(ctx, opsLis, transport.NewMux(transport.MuxConfig{Gatherer: reg, Pprof: cfg.pprof, Ready: node.Ready, Reason: node.Reason}))
		}()
		fmt.Fprintf(stdout, "operator listening on http://%s\n", opsLis.Addr())
	}
	var h http.Handler = node.Handler(gatherer, cfg.pprof && cfg.operatorAddr == "", transport.NewMetrics(reg))
	if cfg.clientCA != "" {
		h = transport.RequireClientCert(h, "/"+shardstockv1connect.ShardServiceName+"/")
	}
	serveErr := transport.ServeTLS(ctx, lis, h, tlsCfg)
	cancel()
	merr, oerr := <-nodeDone, <-opsDone
	log.Info("shard server stopped", "id", cfg.id)
	return errors.Join(serveErr, merr, oerr)
}

// config is the command's configuration: its flags, each with its
// environment variable as its default.
type config struct {
	addr, advertise, id       string
	operatorAddr              string
	stores                    startup.Stores
	leaseTTL, groupDelay      time.Duration
	maxConns                  int
	format, level             string
	pprof, requireSync        bool
	tlsCert, tlsKey, clientCA string
}

// parseConfig reads the flags.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	host, _ := os.Hostname()
	env := startup.NewEnvDefaults(getenv)
	fs := flag.NewFlagSet("shard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", env.String("SHARDSTOCK_SHARD_ADDR", "127.0.0.1:7001"), "listen address (env SHARDSTOCK_SHARD_ADDR)")
	fs.StringVar(&c.operatorAddr, "operator-addr", env.String("SHARDSTOCK_SHARD_OPERATOR_ADDR", ""), "listen address of a cleartext operator listener for /metrics, /debug/pprof/ (with -pprof), /healthz and /readyz, which then leave the shard port; empty: all on the shard port (env SHARDSTOCK_SHARD_OPERATOR_ADDR)")
	fs.StringVar(&c.advertise, "advertise", env.String("SHARDSTOCK_ADVERTISE", ""), "address allocators dial; default: the listen address (env SHARDSTOCK_ADVERTISE)")
	fs.StringVar(&c.id, "id", env.String("SHARDSTOCK_SERVER_ID", host), "server id, unique among shard servers (env SHARDSTOCK_SERVER_ID)")
	c.stores.Flags(fs, env)
	fs.DurationVar(&c.leaseTTL, "lease-ttl", env.Duration("SHARDSTOCK_LEASE_TTL", shardnode.LeaseTTLDefault), "etcd lease TTL: a dead server's partitions move after about this long (env SHARDSTOCK_LEASE_TTL)")
	fs.IntVar(&c.maxConns, "db-max-conns", env.Int("SHARDSTOCK_DB_MAX_CONNS", 32), "Postgres connections at most (env SHARDSTOCK_DB_MAX_CONNS)")
	fs.StringVar(&c.format, "log-format", env.String("SHARDSTOCK_LOG_FORMAT", "text"), startup.LogFormatUsage)
	fs.BoolVar(&c.pprof, "pprof", env.Bool("SHARDSTOCK_PPROF", false), "serve /debug/pprof/ (env SHARDSTOCK_PPROF=1)")
	fs.StringVar(&c.level, "log-level", env.String("SHARDSTOCK_LOG_LEVEL", "info"), "debug, info, warn or error (env SHARDSTOCK_LOG_LEVEL)")
	fs.StringVar(&c.tlsCert, "tls-cert", env.String("SHARDSTOCK_TLS_CERT", ""), startup.TLSUsage)
	fs.StringVar(&c.tlsKey, "tls-key", env.String("SHARDSTOCK_TLS_KEY", ""), "see -tls-cert")
	fs.StringVar(&c.clientCA, "tls-client-ca", env.String("SHARDSTOCK_TLS_CLIENT_CA", ""), "with -tls-cert: the CA whose certificates allocators must present to call the ShardService (mTLS); /healthz, /readyz, /metrics and /drain need none (env SHARDSTOCK_TLS_CLIENT_CA)")
	fs.DurationVar(&c.groupDelay, "group-delay", env.Duration("SHARDSTOCK_GROUP_DELAY", 0), shardnode.GroupDelayUsage)
	fs.BoolVar(&c.requireSync, "require-sync-standby", env.Bool("SHARDSTOCK_REQUIRE_SYNC_STANDBY", false), shardnode.RequireSyncStandbyUsage)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return c, env.Err()
}
