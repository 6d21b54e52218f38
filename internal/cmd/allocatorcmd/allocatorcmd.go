// Package allocatorcmd is the allocator command: flags and environment,
// wiring, serving and shutdown. cmd/allocator and the dev stack run it.
package allocatorcmd

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/cmd/startup"
	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/shardnode"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
)

// postgres.DB is the store the allocator reads, through a dbset.Set when
// SKUs are placed on several databases.
var (
	_ allocator.Store = (*postgres.DB)(nil)
	_ allocator.Store = (*dbset.Set)(nil)
)

// Run runs the command until ctx ends; args are the command-line arguments
// without the program name.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("allocator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", startup.Env(getenv, "SHARDSTOCK_ADDR", "127.0.0.1:8080"), "listen address (env SHARDSTOCK_ADDR)")
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres URL of the database named main (env DATABASE_URL)")
	moreDBs := fs.String("databases", getenv("SHARDSTOCK_DATABASES"), startup.DatabasesUsage)
	migrateURL := fs.String("migrate-url", getenv("SHARDSTOCK_MIGRATE_URL"), startup.MigrateUsage)
	migrateDBs := fs.String("migrate-databases", getenv("SHARDSTOCK_MIGRATE_DATABASES"), startup.MigrateDatabasesUsage)
	etcd := fs.String("etcd-endpoints", getenv("ETCD_ENDPOINTS"), "comma-separated etcd endpoints (env ETCD_ENDPOINTS)")
	etcdCA := fs.String("etcd-ca", getenv("ETCD_CACERT"), startup.EtcdTLSUsage)
	etcdCert := fs.String("etcd-cert", getenv("ETCD_CERT"), "see -etcd-ca")
	etcdKey := fs.String("etcd-key", getenv("ETCD_KEY"), "see -etcd-ca")
	token := fs.String("admin-token", getenv("SHARDSTOCK_ADMIN_TOKEN"), "bearer token of the admin API (env SHARDSTOCK_ADMIN_TOKEN)")
	apiToken := fs.String("api-token", getenv("SHARDSTOCK_API_TOKEN"), "bearer token the InventoryService requires (the admin token is accepted too); empty: none (env SHARDSTOCK_API_TOKEN)")
	rateLimit := fs.Float64("rate-limit", 0, "InventoryService requests a second one client (IP address) may send, sustained and in a burst; over it RATE_LIMITED; 0: no limit (env SHARDSTOCK_RATE_LIMIT)")
	inFlight := fs.Int("max-in-flight", 4096, "InventoryService requests served at once, all clients; beyond it RATE_LIMITED at once; 0: no bound (env SHARDSTOCK_MAX_IN_FLIGHT)")
	clientConns := fs.Int("max-client-conns", clientConnsDefault, "client connections held at once on the public listener; one more is reset as soon as accepted, "+
		"so a storm of dials costs an accept and a close each and the listen queue keeps draining; 0: no bound (env SHARDSTOCK_MAX_CLIENT_CONNS)")
	maxConns := fs.Int("db-max-conns", 16, "Postgres connections at most (with -shard-id, shared with the shard server) (env SHARDSTOCK_DB_MAX_CONNS)")
	format := fs.String("log-format", "text", startup.LogFormatUsage)
	shardID := fs.String("shard-id", getenv("SHARDSTOCK_LOCAL_SHARD_ID"), "also run a shard server with this id in this process: it takes its share of the partitions, serves other allocators on -shard-addr, and this allocator calls it without RPC (env SHARDSTOCK_LOCAL_SHARD_ID)")
	shardAddr := fs.String("shard-addr", startup.Env(getenv, "SHARDSTOCK_SHARD_ADDR", "127.0.0.1:0"), "with -shard-id, the internal listen address of its ShardService, which has no authentication and must not be the public one; port 0 picks one (env SHARDSTOCK_SHARD_ADDR)")
	advertise := fs.String("advertise", getenv("SHARDSTOCK_ADVERTISE"), "with -shard-id, the address other allocators dial; default: the -shard-addr listener's address (env SHARDSTOCK_ADVERTISE)")
	leaseTTL := fs.Duration("lease-ttl", shardnode.LeaseTTLDefault, "with -shard-id, the etcd lease TTL of its shard server (env SHARDSTOCK_LEASE_TTL)")
	groupDelay := fs.Duration("group-delay", 0, "with -shard-id, its shard server's: "+shardnode.GroupDelayUsage)
	pprofOn := fs.Bool("pprof", getenv("SHARDSTOCK_PPROF") == "1", "serve /debug/pprof/ on the operator listener (env SHARDSTOCK_PPROF=1)")
	operatorAddr := fs.String("operator-addr", startup.Env(getenv, "SHARDSTOCK_OPERATOR_ADDR", "127.0.0.1:0"), "listen address of the operator listener: /metrics, /debug/pprof/ (with -pprof), /healthz and /readyz, never on the public port; port 0 picks one (env SHARDSTOCK_OPERATOR_ADDR)")
	level := fs.String("log-level", startup.Env(getenv, "SHARDSTOCK_LOG_LEVEL", "info"), "debug, info, warn or error")
	rebalanceOn := fs.Bool("rebalance", getenv("SHARDSTOCK_REBALANCE") != "0", "run the rebalancer's refill and tail plans (env SHARDSTOCK_REBALANCE=0 turns them off); drains of retired shards, SetShards, Rebalance and consolidation run regardless")
	autoShards := fs.Bool("auto-shards", getenv("SHARDSTOCK_AUTO_SHARDS") != "0", "split hot SKUs and merge them back when cold, automatically (env SHARDSTOCK_AUTO_SHARDS=0 turns it off)")
	retireGrace := fs.Duration("retire-grace", 0, "how long after a SKU's shard count last changed its shards out of service may retire, once empty; 0 means 15s, and it must exceed the longest a shard batch runs (10 s)")
	tlsCert := fs.String("tls-cert", getenv("SHARDSTOCK_TLS_CERT"), startup.TLSUsage)
	shardCert := fs.String("shard-tls-cert", getenv("SHARDSTOCK_SHARD_TLS_CERT"), "the client certificate this allocator presents to shard servers that require one (mTLS); with -shard-tls-key and -shard-tls-ca, the CA of the shard servers' certificates (env SHARDSTOCK_SHARD_TLS_CERT, _KEY, _CA)")
	shardKey := fs.String("shard-tls-key", getenv("SHARDSTOCK_SHARD_TLS_KEY"), "see -shard-tls-cert")
	shardCA := fs.String("shard-tls-ca", getenv("SHARDSTOCK_SHARD_TLS_CA"), "see -shard-tls-cert; with -shard-id, also the CA its own shard listener requires of callers")
	tlsKey := fs.String("tls-key", getenv("SHARDSTOCK_TLS_KEY"), "see -tls-cert")
	corsOrigins := fs.String("cors-origins", getenv("SHARDSTOCK_CORS_ORIGINS"), "comma-separated origins whose browser clients may call the API (CORS), e.g. https://shop.example.com; empty: none (env SHARDSTOCK_CORS_ORIGINS)")
	requireSync := fs.Bool("require-sync-standby", getenv("SHARDSTOCK_REQUIRE_SYNC_STANDBY") == "1", "with -shard-id, "+shardnode.RequireSyncStandbyUsage)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := startup.FlagsFromEnv(fs, getenv, map[string]string{"lease-ttl": "SHARDSTOCK_LEASE_TTL",
		"db-max-conns": "SHARDSTOCK_DB_MAX_CONNS", "log-format": "SHARDSTOCK_LOG_FORMAT",
		"rate-limit": "SHARDSTOCK_RATE_LIMIT", "max-in-flight": "SHARDSTOCK_MAX_IN_FLIGHT", "group-delay": "SHARDSTOCK_GROUP_DELAY",
		"max-client-conns": "SHARDSTOCK_MAX_CLIENT_CONNS"}); err != nil {
		return err
	}
	log, err := startup.Logger(stderr, *level, *format)
	if err != nil {
		return err
	}
	if err := shardnode.CheckGroupDelay(*groupDelay); err != nil {
		return err
	}
	dbs, err := startup.Databases(*dbURL, *moreDBs)
	if err != nil {
		return err
	}
	if len(*token) < adminTokenLenMin {
		return fmt.Errorf("the admin token must be at least %d characters: set -admin-token or SHARDSTOCK_ADMIN_TOKEN", adminTokenLenMin)
	}
	if *apiToken != "" && len(*apiToken) < adminTokenLenMin {
		return fmt.Errorf("the API token must be at least %d characters (-api-token, SHARDSTOCK_API_TOKEN)", adminTokenLenMin)
	}
	tlsCfg, err := startup.TLSConfig(*tlsCert, *tlsKey, "")
	if err != nil {
		return err
	}
	scheme := startup.Scheme(tlsCfg)
	shardClientTLS, err := startup.ClientTLSConfig(*shardCert, *shardKey, *shardCA)
	if err != nil {
		return err
	}
	if *rateLimit < 0 || *inFlight < 0 || *clientConns < 0 {
		return errors.New("-rate-limit, -max-in-flight and -max-client-conns must not be negative")
	}

	dbOpts, err := startup.WithMigrateURLs(postgres.Options{MaxConns: int32(*maxConns), ApplicationName: "shardstock-allocator"}, dbs, *migrateURL, *migrateDBs)
	if err != nil {
		return err
	}
	proc, err := startup.Open(ctx, dbs, dbOpts, startup.EtcdConfig{Endpoints: *etcd, CA: *etcdCA, Cert: *etcdCert, Key: *etcdKey}, *addr, log)
	if err != nil {
		return err
	}
	defer proc.Close()
	client, lis, reg := proc.Etcd, proc.Listener, proc.Registry

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Not ready while etcd is behind the databases' fences (restored or
	// rebuilt): its moves and CreateSku would all be fenced.
	etcdCheck := startup.CheckEtcd(ctx, proc.DBs, client, log)
	watcher := topology.NewWatcher(client, stock.Partitions)
	watchDone := make(chan error, 1)
	go func() { watchDone <- watcher.Run(ctx) }()

	services := []string{shardstockv1connect.InventoryServiceName, shardstockv1connect.AdminServiceName}
	host, _ := os.Hostname()
	moves := topology.NewMoveLeases(client, fmt.Sprintf("allocator/%s/%d@%s", host, os.Getpid(), lis.Addr()), 0, log)
	defer moves.Close()
	acfg := allocator.Config{DB: proc.DBs, Topology: watcher.Snapshot, Logger: log, Registerer: reg, Moves: moves,
		Rebalance: allocator.RebalanceConfig{Off: !*rebalanceOn, Auto: allocator.AutoShards{Off: !*autoShards}, RetireGrace: *retireGrace}}
	if shardClientTLS != nil {
		acfg.HTTPClient, acfg.ShardScheme = transport.NewInternalTLSClient(shardClientTLS), "https"
	}
	// With mTLS, this allocator's own shard listener speaks it too: its
	// -tls-cert, callers' certificates signed by -shard-tls-ca.
	var localTLS *tls.Config
	if shardClientTLS != nil && *shardID != "" {
		if localTLS, err = startup.TLSConfig(*tlsCert, *tlsKey, *shardCA); err != nil || localTLS == nil {
			return fmt.Errorf("-shard-id with -shard-tls-*: its shard listener needs -tls-cert and -tls-key too (%v)", err)
		}
	}
	var node *shardnode.Node
	var shardLis net.Listener
	if *shardID != "" {
		if err := shardnode.CheckDurabilityAll(ctx, proc.DBs, *requireSync, log); err != nil {
			return err
		}
		// The ShardService answers any caller: it gets a listener of its
		// own, as cmd/shard's, never the public port.
		if shardLis, err = net.Listen("tcp", *shardAddr); err != nil {
			return fmt.Errorf("-shard-addr: %w", err)
		}
		defer shardLis.Close()
		if *advertise == "" {
			*advertise = shardLis.Addr().String()
		}
		node = shardnode.New(shardnode.Config{ID: *shardID, Advertise: *advertise, DBs: proc.DBs, Etcd: client,
			LeaseTTL: *leaseTTL, Logger: log, Registry: reg, GroupDelay: *groupDelay, EtcdCheck: etcdCheck})
		acfg.Local, acfg.LocalID = node.Server, *shardID
	}
	alloc := allocator.New(acfg)
	defer alloc.Close()
	ready := func() bool { return etcdCheck.Reason() == "" && alloc.Ready() }

	// The public mux has no /metrics and no /debug/pprof: those are on the
	// operator listener.
	mux := transport.NewMux(transport.MuxConfig{
		Services: services,
		Ready:    ready,
		Reason:   etcdCheck.Reason,
	})
	opsLis, err := startup.Listen(ctx, *operatorAddr)
	if err != nil {
		return fmt.Errorf("-operator-addr: %w", err)
	}
	defer opsLis.Close()
	opsDone := make(chan error, 1)
	go func() {
		opsDone <- transport.ServeTLS(ctx, opsLis, transport.NewMux(transport.MuxConfig{Gatherer: reg, Pprof: *pprofOn, Ready: ready, Reason: etcdCheck.Reason}), tlsCfg)
	}()
	fmt.Fprintf(stdout, "operator listening on %s://%s\n", scheme, opsLis.Addr())
	metrics := transport.NewMetrics(reg)
	// The InventoryService's admission (API token, per-client rate,
	// requests in flight) runs before Connect decodes a request, so that
	// a burst is shed at the transport's cost; its refusals are counted in
	// the call metrics too.
	admit := api.AdmitConfig{TokenName: "API token", PerClient: *rateLimit, InFlight: *inFlight}
	if *apiToken != "" {
		// The admin token is accepted too: an operator's tools (stockctl,
		// the dashboard) read stock with it.
		admit.Tokens = []string{*apiToken, *token}
	}
	invPath, invHandler := shardstockv1connect.NewInventoryServiceHandler(&api.InventoryHandler{Inventory: alloc},
		append(transport.PublicHandlerOptions(), connect.WithInterceptors(metrics))...)
	mux.Handle(invPath, api.Admit(admit, transport.Warm(invHandler, 0), metrics.Refused))
	mux.Handle(shardstockv1connect.NewAdminServiceHandler(&api.AdminHandler{Admin: alloc, Placement: proc.DBs},
		append(transport.PublicHandlerOptions(), connect.WithInterceptors(metrics, api.BearerAuth(*token)))...))
	mux.Handle("/", api.Dashboard())
	nodeDone, shardDone := make(chan error, 1), make(chan error, 1)
	if node != nil {
		go func() { nodeDone <- node.Run(ctx) }()
		var localShard http.Handler = node.Handler(nil, false, metrics)
		if localTLS != nil {
			localShard = transport.RequireClientCert(localShard, "/"+shardstockv1connect.ShardServiceName+"/")
		}
		go func() {
			err := transport.ServeTLS(ctx, shardLis, localShard, localTLS)
			if err != nil {
				cancel() // a member others cannot reach must not stay one
			}
			shardDone <- err
		}()
		fmt.Fprintf(stdout, "shard %s listening on %s\n", *shardID, shardLis.Addr())
		log.Info("shard server started", "id", *shardID, "addr", shardLis.Addr().String(), "advertise", *advertise, "in", "allocator")
	} else {
		nodeDone <- nil
		shardDone <- nil
	}

	fmt.Fprintf(stdout, "allocator listening on %s://%s\n", scheme, lis.Addr())
	go readiness.Announce(ctx, stdout, readiness.Line{Role: readiness.RoleAllocator,
		Addr: scheme + "://" + lis.Addr().String(), Operator: scheme + "://" + opsLis.Addr().String()}, ready)
	log.Info("allocator started", "addr", lis.Addr().String())
	public := transport.LimitConns(lis, *clientConns, transport.NewConnMetrics(reg, "shardstock_allocator_client"))
	serveErr := transport.ServeTLS(ctx, public, transport.CORS(mux, splitList(*corsOrigins)), tlsCfg)
	cancel()
	serr, nerr, oerr := <-shardDone, <-nodeDone, <-opsDone
	<-watchDone
	log.Info("allocator stopped")
	return errors.Join(serveErr, serr, nerr, oerr)
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// adminTokenLenMin keeps guessable tokens out.
const adminTokenLenMin = 16

// clientConnsDefault bounds the public listener's connections
// (-max-client-conns): at about 16 KB an idle connection (client and
// server together, transport's BenchmarkIdleConnMemory), 8,192 hold about
// 130 MB of deploy/k8s's 512 MiB; a client multiplexes its calls over a
// few connections, so a fleet needs far fewer.
const clientConnsDefault = 8192
