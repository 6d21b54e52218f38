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
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("shard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", startup.Env(getenv, "SHARDSTOCK_SHARD_ADDR", "127.0.0.1:7001"), "listen address (env SHARDSTOCK_SHARD_ADDR)")
	advertise := fs.String("advertise", getenv("SHARDSTOCK_ADVERTISE"), "address allocators dial; default: the listen address (env SHARDSTOCK_ADVERTISE)")
	id := fs.String("id", startup.Env(getenv, "SHARDSTOCK_SERVER_ID", host), "server id, unique among shard servers (env SHARDSTOCK_SERVER_ID)")
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres URL of the database named main (env DATABASE_URL)")
	moreDBs := fs.String("databases", getenv("SHARDSTOCK_DATABASES"), startup.DatabasesUsage)
	migrateURL := fs.String("migrate-url", getenv("SHARDSTOCK_MIGRATE_URL"), startup.MigrateUsage)
	migrateDBs := fs.String("migrate-databases", getenv("SHARDSTOCK_MIGRATE_DATABASES"), startup.MigrateDatabasesUsage)
	etcd := fs.String("etcd-endpoints", getenv("ETCD_ENDPOINTS"), "comma-separated etcd endpoints (env ETCD_ENDPOINTS)")
	etcdCA := fs.String("etcd-ca", getenv("ETCD_CACERT"), startup.EtcdTLSUsage)
	etcdCert := fs.String("etcd-cert", getenv("ETCD_CERT"), "see -etcd-ca")
	etcdKey := fs.String("etcd-key", getenv("ETCD_KEY"), "see -etcd-ca")
	leaseTTL := fs.Duration("lease-ttl", shardnode.LeaseTTLDefault, "etcd lease TTL: a dead server's partitions move after about this long (env SHARDSTOCK_LEASE_TTL)")
	maxConns := fs.Int("db-max-conns", 32, "Postgres connections at most (env SHARDSTOCK_DB_MAX_CONNS)")
	format := fs.String("log-format", "text", startup.LogFormatUsage)
	pprofOn := fs.Bool("pprof", getenv("SHARDSTOCK_PPROF") == "1", "serve /debug/pprof/ (env SHARDSTOCK_PPROF=1)")
	level := fs.String("log-level", startup.Env(getenv, "SHARDSTOCK_LOG_LEVEL", "info"), "debug, info, warn or error")
	tlsCert := fs.String("tls-cert", getenv("SHARDSTOCK_TLS_CERT"), startup.TLSUsage)
	tlsKey := fs.String("tls-key", getenv("SHARDSTOCK_TLS_KEY"), "see -tls-cert")
	clientCA := fs.String("tls-client-ca", getenv("SHARDSTOCK_TLS_CLIENT_CA"), "with -tls-cert: the CA whose certificates allocators must present to call the ShardService (mTLS); /healthz, /readyz, /metrics and /drain need none (env SHARDSTOCK_TLS_CLIENT_CA)")
	groupDelay := fs.Duration("group-delay", 0, shardnode.GroupDelayUsage)
	requireSync := fs.Bool("require-sync-standby", getenv("SHARDSTOCK_REQUIRE_SYNC_STANDBY") == "1", shardnode.RequireSyncStandbyUsage)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := startup.FlagsFromEnv(fs, getenv, map[string]string{"lease-ttl": "SHARDSTOCK_LEASE_TTL",
		"db-max-conns": "SHARDSTOCK_DB_MAX_CONNS", "log-format": "SHARDSTOCK_LOG_FORMAT", "group-delay": "SHARDSTOCK_GROUP_DELAY"}); err != nil {
		return err
	}
	if err := shardnode.CheckGroupDelay(*groupDelay); err != nil {
		return err
	}
	log, err := startup.Logger(stderr, *level, *format)
	if err != nil {
		return err
	}
	tlsCfg, err := startup.TLSConfig(*tlsCert, *tlsKey, *clientCA)
	if err != nil {
		return err
	}
	dbs, err := startup.Databases(*dbURL, *moreDBs)
	if err != nil {
		return err
	}
	if *id == "" {
		return errors.New("no server id: set -id or SHARDSTOCK_SERVER_ID")
	}

	dbOpts, err := startup.WithMigrateURLs(postgres.Options{MaxConns: int32(*maxConns), ApplicationName: "shardstock-shard-" + *id}, dbs, *migrateURL, *migrateDBs)
	if err != nil {
		return err
	}
	proc, err := startup.Open(ctx, dbs, dbOpts, startup.EtcdConfig{Endpoints: *etcd, CA: *etcdCA, Cert: *etcdCert, Key: *etcdKey}, *addr, log)
	if err != nil {
		return err
	}
	defer proc.Close()
	client, lis, reg := proc.Etcd, proc.Listener, proc.Registry
	if err := shardnode.CheckDurabilityAll(ctx, proc.DBs, *requireSync, log); err != nil {
		return err
	}
	if *advertise == "" {
		*advertise = lis.Addr().String()
	}

	// Shut down in reverse: stop serving, leave the topology (others take
	// the partitions at once), stop the writers, close the database.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The node joins the topology only once etcd is past the databases'
	// fences (restored or rebuilt, it may be behind them).
	node := shardnode.New(shardnode.Config{ID: *id, Advertise: *advertise, DBs: proc.DBs, Etcd: client, LeaseTTL: *leaseTTL, Logger: log, Registry: reg,
		GroupDelay: *groupDelay, EtcdCheck: startup.CheckEtcd(ctx, proc.DBs, client, log)})
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- node.Run(ctx) }()
	fmt.Fprintf(stdout, "shard %s listening on %s\n", *id, lis.Addr())
	go readiness.Announce(ctx, stdout, readiness.Line{Role: readiness.RoleShard, ID: *id, Addr: startup.Scheme(tlsCfg) + "://" + lis.Addr().String()}, node.Ready)
	log.Info("shard server started", "id", *id, "addr", lis.Addr().String(), "advertise", *advertise)
	var h http.Handler = node.Handler(reg, *pprofOn, transport.NewMetrics(reg))
	if *clientCA != "" {
		h = transport.RequireClientCert(h, "/"+shardstockv1connect.ShardServiceName+"/")
	}
	serveErr := transport.ServeTLS(ctx, lis, h, tlsCfg)
	cancel()
	merr := <-nodeDone
	log.Info("shard server stopped", "id", *id)
	return errors.Join(serveErr, merr)
}
