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
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/cmd/startup"
	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/shardnode"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
)

// postgres.DB is the store the allocator reads, through a dbset.Set when
// SKUs are placed on several databases.
var (
	_ allocator.Store      = (*postgres.DB)(nil)
	_ allocator.Store      = (*dbset.Set)(nil)
	_ allocator.OrderStore = (*postgres.DB)(nil)
)

// Run runs the command until ctx ends; args are the command-line arguments
// without the program name. It reads its configuration, opens its adapters
// (databases, etcd, the public listener), wires the allocator over them,
// serves until ctx ends or the public listener fails, and shuts down in
// reverse order.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := startup.Logger(stderr, cfg.level, cfg.logFormat)
	if err != nil {
		return err
	}
	if err := cfg.check(log); err != nil {
		return err
	}
	dbOpts, err := startup.WithMigrateURLs(postgres.Options{MaxConns: int32(cfg.maxConns), ApplicationName: "shardstock-allocator"}, cfg.dbs, cfg.stores.MigrateURL, cfg.stores.MigrateDatabases)
	if err != nil {
		return err
	}
	proc, err := startup.Open(ctx, cfg.dbs, dbOpts, cfg.stores.Etcd, cfg.addr, log)
	if err != nil {
		return err
	}
	defer proc.Close()

	audit, closeAudit, err := auditLog(cfg, proc, log, stderr)
	if err != nil {
		return err
	}
	defer closeAudit()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := wire(ctx, cfg, proc, log)
	defer w.close()
	if err != nil {
		return err
	}
	w.audit = audit
	return serve(ctx, cancel, cfg, proc, w, log, stdout)
}

// config is the command's configuration: its flags, each with its
// environment variable as its default, and what check derives from them.
type config struct {
	addr, operatorAddr                        string
	stores                                    startup.Stores
	token, serviceToken, publicToken          string
	jwks, jwtIssuer, jwtAudience              string
	jwksRefresh                               time.Duration
	publicCalls, trustedProxies               string
	rateLimit, serviceRateLimit               float64
	aheadBytes                                int
	inFlight, clientConns, maxConns           int
	logFormat, level, auditLog                string
	shardID, shardAddr, advertise             string
	leaseTTL, groupDelay, retireGrace         time.Duration
	pprof, rebalance, autoShards, requireSync bool
	tlsCert, tlsKey, serviceClientCA          string
	shardCert, shardKey, shardCA              string
	corsOrigins                               string

	// Derived by check.
	dbs            map[string]string // by name
	policy         *api.Policy
	proxies        []netip.Prefix
	tls            *tls.Config          // of every listener; nil: cleartext
	publicTLS      *tls.Config          // of the public listener: tls, asking for client certificates with serviceCAs
	serviceCAs     *transport.CertFiles // -service-client-ca; nil: none
	scheme         string               // "https" with tls, else "http"
	shardClientTLS *transport.CertFiles // to call shard servers; nil: cleartext
	localTLS       *tls.Config          // of -shard-id's listener with mTLS
}

// parseConfig reads the flags.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	env := startup.NewEnvDefaults(getenv)
	fs := flag.NewFlagSet("allocator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", env.String("SHARDSTOCK_ADDR", "127.0.0.1:8080"), "listen address (env SHARDSTOCK_ADDR)")
	c.stores.Flags(fs, env)
	fs.StringVar(&c.token, "admin-token", env.String("SHARDSTOCK_ADMIN_TOKEN", ""), "bearer tokens of the admin role (the AdminService, and all a service may do), comma-separated: several while one is rotated out (env SHARDSTOCK_ADMIN_TOKEN)")
	fs.StringVar(&c.serviceToken, "service-token", env.String("SHARDSTOCK_SERVICE_TOKEN", ""), "bearer tokens of the service role (every InventoryService call: the shop's backends), comma-separated (env SHARDSTOCK_SERVICE_TOKEN)")
	fs.StringVar(&c.publicToken, "public-token", env.String("SHARDSTOCK_PUBLIC_TOKEN", ""), "bearer tokens of the public role (apps: what a caller without a credential may do, and no customer), comma-separated (env SHARDSTOCK_PUBLIC_TOKEN)")
	fs.StringVar(&c.jwks, "jwks", env.String("SHARDSTOCK_JWKS", ""), "file or http(s) URL of the JSON Web Key Set whose keys sign JWT credentials (claims: role public, service or admin; sub, the customer of a public one); read again every -jwks-refresh; empty: no JWTs (env SHARDSTOCK_JWKS)")
	fs.StringVar(&c.jwtIssuer, "jwt-issuer", env.String("SHARDSTOCK_JWT_ISSUER", ""), "with -jwks, the iss a JWT must name (env SHARDSTOCK_JWT_ISSUER)")
	fs.StringVar(&c.jwtAudience, "jwt-audience", env.String("SHARDSTOCK_JWT_AUDIENCE", ""), "with -jwks, the aud a JWT must name (env SHARDSTOCK_JWT_AUDIENCE)")
	fs.DurationVar(&c.jwksRefresh, "jwks-refresh", env.Duration("SHARDSTOCK_JWKS_REFRESH", auth.RefreshDefault), "how often -jwks is read again (a JWT of a key id it does not know reads it at once, at most once a second) (env SHARDSTOCK_JWKS_REFRESH)")
	fs.StringVar(&c.publicCalls, "public-calls", env.String("SHARDSTOCK_PUBLIC_CALLS", ""), "InventoryService calls the public role may make besides GetStock, comma-separated, of "+strings.Join(api.PublicOptIns, ", ")+"; empty: none (env SHARDSTOCK_PUBLIC_CALLS)")
	fs.Float64Var(&c.rateLimit, "rate-limit", env.Float64("SHARDSTOCK_RATE_LIMIT", 0), "InventoryService requests a second one public client (IP address) may send, sustained and in a burst; over it RATE_LIMITED; 0: no limit (env SHARDSTOCK_RATE_LIMIT)")
	fs.Float64Var(&c.serviceRateLimit, "service-rate-limit", env.Float64("SHARDSTOCK_SERVICE_RATE_LIMIT", 0), "requests a second one service or admin credential may send, sustained and in a burst; over it RATE_LIMITED; 0: no limit (env SHARDSTOCK_SERVICE_RATE_LIMIT)")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", env.String("SHARDSTOCK_TRUSTED_PROXIES", ""), "comma-separated addresses or CIDRs of the load balancers in front: from them, X-Forwarded-For names the client that -rate-limit counts; from any other peer it is ignored (env SHARDSTOCK_TRUSTED_PROXIES)")
	fs.IntVar(&c.aheadBytes, "max-read-ahead-bytes", env.Int("SHARDSTOCK_MAX_READ_AHEAD_BYTES", api.AheadBytesDefault), "bytes of request messages read before admission, all requests together; beyond it RATE_LIMITED at once, so that slow senders of large messages cannot fill memory (env SHARDSTOCK_MAX_READ_AHEAD_BYTES)")
	fs.IntVar(&c.inFlight, "max-in-flight", env.Int("SHARDSTOCK_MAX_IN_FLIGHT", api.InFlightDefault), "InventoryService requests served at once, all clients; beyond it RATE_LIMITED at once; 0: no bound (env SHARDSTOCK_MAX_IN_FLIGHT)")
	fs.IntVar(&c.clientConns, "max-client-conns", env.Int("SHARDSTOCK_MAX_CLIENT_CONNS", clientConnsDefault), "client connections held at once on the public listener; one more is reset as soon as accepted, "+
		"so a storm of dials costs an accept and a close each and the listen queue keeps draining; 0: no bound (env SHARDSTOCK_MAX_CLIENT_CONNS)")
	fs.IntVar(&c.maxConns, "db-max-conns", env.Int("SHARDSTOCK_DB_MAX_CONNS", 16), "Postgres connections at most (with -shard-id, shared with the shard server) (env SHARDSTOCK_DB_MAX_CONNS)")
	fs.StringVar(&c.logFormat, "log-format", env.String("SHARDSTOCK_LOG_FORMAT", "text"), startup.LogFormatUsage)
	fs.StringVar(&c.shardID, "shard-id", env.String("SHARDSTOCK_LOCAL_SHARD_ID", ""), "also run a shard server with this id in this process: it takes its share of the partitions, serves other allocators on -shard-addr, and this allocator calls it without RPC (env SHARDSTOCK_LOCAL_SHARD_ID)")
	fs.StringVar(&c.shardAddr, "shard-addr", env.String("SHARDSTOCK_SHARD_ADDR", "127.0.0.1:0"), "with -shard-id, the internal listen address of its ShardService, which has no authentication and must not be the public one; port 0 picks one (env SHARDSTOCK_SHARD_ADDR)")
	fs.StringVar(&c.advertise, "advertise", env.String("SHARDSTOCK_ADVERTISE", ""), "with -shard-id, the address other allocators dial; default: the -shard-addr listener's address (env SHARDSTOCK_ADVERTISE)")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", env.Duration("SHARDSTOCK_LEASE_TTL", shardnode.LeaseTTLDefault), "with -shard-id, the etcd lease TTL of its shard server (env SHARDSTOCK_LEASE_TTL)")
	fs.DurationVar(&c.groupDelay, "group-delay", env.Duration("SHARDSTOCK_GROUP_DELAY", 0), "with -shard-id, its shard server's: "+shardnode.GroupDelayUsage)
	fs.BoolVar(&c.pprof, "pprof", env.Bool("SHARDSTOCK_PPROF", false), "serve /debug/pprof/ on the operator listener (env SHARDSTOCK_PPROF=1)")
	fs.StringVar(&c.operatorAddr, "operator-addr", env.String("SHARDSTOCK_OPERATOR_ADDR", "127.0.0.1:0"), "listen address of the operator listener: /metrics, /debug/pprof/ (with -pprof), /healthz and /readyz, never on the public port; port 0 picks one (env SHARDSTOCK_OPERATOR_ADDR)")
	fs.StringVar(&c.auditLog, "audit-log", env.String("SHARDSTOCK_AUDIT_LOG", "async"), "the line at info that names the caller of each stock-changing call: async (formatted and written by a goroutine of its own, several lines a write; lines beyond a bounded queue are dropped, counted in shardstock_allocator_audit_lines_dropped_total and said), sync (written by the call), or off (the ledger alone names callers; for measuring the lines' cost) (env SHARDSTOCK_AUDIT_LOG)")
	fs.StringVar(&c.level, "log-level", env.String("SHARDSTOCK_LOG_LEVEL", "info"), "debug, info, warn or error (env SHARDSTOCK_LOG_LEVEL)")
	fs.BoolVar(&c.rebalance, "rebalance", env.Bool("SHARDSTOCK_REBALANCE", true), "run the rebalancer's refill and tail plans (env SHARDSTOCK_REBALANCE=0 turns them off); drains of retired shards, SetShards, Rebalance and consolidation run regardless")
	fs.BoolVar(&c.autoShards, "auto-shards", env.Bool("SHARDSTOCK_AUTO_SHARDS", true), "split hot SKUs and merge them back when cold, automatically (env SHARDSTOCK_AUTO_SHARDS=0 turns it off)")
	fs.DurationVar(&c.retireGrace, "retire-grace", env.Duration("SHARDSTOCK_RETIRE_GRACE", 0), "how long after a SKU's shard count last changed its shards out of service may retire, once empty; 0 means 15s, and it must exceed the longest a shard batch runs (10 s) (env SHARDSTOCK_RETIRE_GRACE)")
	fs.StringVar(&c.tlsCert, "tls-cert", env.String("SHARDSTOCK_TLS_CERT", ""), startup.TLSUsage)
	fs.StringVar(&c.shardCert, "shard-tls-cert", env.String("SHARDSTOCK_SHARD_TLS_CERT", ""), "the client certificate this allocator presents to shard servers that require one (mTLS); with -shard-tls-key and -shard-tls-ca, the CA of the shard servers' certificates (env SHARDSTOCK_SHARD_TLS_CERT, _KEY, _CA)")
	fs.StringVar(&c.shardKey, "shard-tls-key", env.String("SHARDSTOCK_SHARD_TLS_KEY", ""), "see -shard-tls-cert")
	fs.StringVar(&c.shardCA, "shard-tls-ca", env.String("SHARDSTOCK_SHARD_TLS_CA", ""), "see -shard-tls-cert; with -shard-id, also the CA its own shard listener requires of callers")
	fs.StringVar(&c.tlsKey, "tls-key", env.String("SHARDSTOCK_TLS_KEY", ""), "see -tls-cert")
	fs.StringVar(&c.serviceClientCA, "service-client-ca", env.String("SHARDSTOCK_SERVICE_CLIENT_CA", ""), "with -tls-cert, PEM file of the CAs whose client certificates are the service role on the public port, named service:cert:<CN or first SAN>; re-read when it changes; a certificate of another CA counts as none (env SHARDSTOCK_SERVICE_CLIENT_CA)")
	fs.StringVar(&c.corsOrigins, "cors-origins", env.String("SHARDSTOCK_CORS_ORIGINS", ""), "comma-separated origins whose browser clients may call the API (CORS), e.g. https://shop.example.com; empty: none (env SHARDSTOCK_CORS_ORIGINS)")
	fs.BoolVar(&c.requireSync, "require-sync-standby", env.Bool("SHARDSTOCK_REQUIRE_SYNC_STANDBY", false), "with -shard-id, "+shardnode.RequireSyncStandbyUsage)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return c, env.Err()
}

// check refuses a configuration that cannot work and derives the
// databases and TLS configurations from it (log: of reloaded TLS files).
func (c *config) check(log *slog.Logger) error {
	if err := shardnode.CheckGroupDelay(c.groupDelay); err != nil {
		return err
	}
	var err error
	if c.dbs, err = startup.Databases(c.stores.DatabaseURL, c.stores.MoreDatabases); err != nil {
		return err
	}
	if len(c.token) < auth.TokenLenMin {
		return fmt.Errorf("the admin token must be at least %d characters: set -admin-token or SHARDSTOCK_ADMIN_TOKEN", auth.TokenLenMin)
	}
	for _, set := range []struct{ role, list string }{{"admin", c.token}, {"service", c.serviceToken}, {"public", c.publicToken}} {
		for _, t := range splitList(set.list) {
			if len(t) < auth.TokenLenMin {
				return fmt.Errorf("a %s token must be at least %d characters (-%s-token)", set.role, auth.TokenLenMin, set.role)
			}
		}
	}
	if c.jwks != "" && (c.jwtIssuer == "" || c.jwtAudience == "") {
		return errors.New("a JWKS (-jwks) needs -jwt-issuer and -jwt-audience: a JWT must name both")
	}
	if c.policy, err = api.NewPolicy(splitList(c.publicCalls)); err != nil {
		return fmt.Errorf("-public-calls: %w", err)
	}
	for _, p := range splitList(c.trustedProxies) {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			addr, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return fmt.Errorf("-trusted-proxies: %q is neither an address nor a CIDR", p)
			}
			prefix = netip.PrefixFrom(addr, addr.BitLen())
		}
		c.proxies = append(c.proxies, prefix)
	}
	if c.maxConns == 1 || c.maxConns < 0 {
		// An admission entry holds its SKU's lock on one connection while
		// it reads the stock, and records a SKU's first ticket, on another.
		return fmt.Errorf("-db-max-conns %d: want 0 (the pool's default) or at least 2", c.maxConns)
	}
	if c.aheadBytes < transport.PublicReadMaxBytes {
		return fmt.Errorf("-max-read-ahead-bytes must be at least %d (one message)", transport.PublicReadMaxBytes)
	}
	if c.tls, err = startup.TLSConfig(c.tlsCert, c.tlsKey, "", log); err != nil {
		return err
	}
	c.scheme, c.publicTLS = "http", c.tls
	if c.tls != nil {
		c.scheme = "https"
	}
	if c.serviceClientCA != "" {
		if c.tls == nil {
			return errors.New("-service-client-ca needs -tls-cert and -tls-key: a client certificate comes over TLS")
		}
		if c.serviceCAs, err = transport.ClientCAFile(c.serviceClientCA, log); err != nil {
			return fmt.Errorf("-service-client-ca: %w", err)
		}
		c.publicTLS = transport.RequestClientCerts(c.tls)
	}
	if c.shardClientTLS, err = startup.ClientTLSConfig(c.shardCert, c.shardKey, c.shardCA, log); err != nil {
		return err
	}
	switch c.auditLog {
	case "async", "sync", "off":
	default:
		return fmt.Errorf("-audit-log %q: want async, sync or off", c.auditLog)
	}
	if c.rateLimit < 0 || c.serviceRateLimit < 0 || c.inFlight < 0 || c.clientConns < 0 {
		return errors.New("-rate-limit, -service-rate-limit, -max-in-flight and -max-client-conns must not be negative")
	}
	// With mTLS, this allocator's own shard listener speaks it too: its
	// -tls-cert, callers' certificates signed by -shard-tls-ca.
	if c.shardClientTLS != nil && c.shardID != "" {
		if c.localTLS, err = startup.TLSConfig(c.tlsCert, c.tlsKey, c.shardCA, log); err != nil || c.localTLS == nil {
			return fmt.Errorf("-shard-id with -shard-tls-*: its shard listener needs -tls-cert and -tls-key too (%v)", err)
		}
	}
	return nil
}

// wired is the allocator and what it runs with, over the process's
// adapters: the topology, the move leases, the scheduled reconciliation,
// and with -shard-id a shard server of its own and that server's listener.
type wired struct {
	etcdCheck   *startup.EtcdCheck
	watchDone   chan error // the topology watcher's Run
	soldOutDone chan error // the sold-out marks' Run
	moves       *topology.MoveLeases
	// stopReconciling ends the scheduled reconciliation, whose Run closes
	// reconciled.
	stopReconciling context.CancelFunc
	reconciled      chan struct{}
	node            *shardnode.Node // nil without -shard-id
	shardLis        net.Listener    // nil without -shard-id
	alloc           *allocator.Allocator
	// admission serves tokens and tickets (nil without a database named
	// main); its worker runs until stopAdmission, then closes admitted.
	admission     *admission.Service
	stopAdmission context.CancelFunc
	admitted      chan struct{}
	changes       *ledger.Stream // WatchLedger and WatchStock
	auth          *auth.Authenticator
	audit         *slog.Logger // stock calls' lines; nil: none
}

// auditLog is the logger of the stock calls' audit lines that -audit-log
// names (nil for off) and what closes it, writing what it holds: the
// process's log for sync, else a startup.AuditLog on stderr whose dropped
// lines the registry counts.
func auditLog(cfg *config, proc *startup.Process, log *slog.Logger, stderr io.Writer) (*slog.Logger, func(), error) {
	switch cfg.auditLog {
	case "off":
		return nil, func() {}, nil
	case "sync":
		return log, func() {}, nil
	}
	a, err := startup.NewAuditLog(stderr, cfg.level, cfg.logFormat)
	if err != nil {
		return nil, nil, err
	}
	proc.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shardstock_allocator_audit_lines_dropped_total",
		Help: "Audit lines of stock calls dropped because more came than the log writer kept up with (-audit-log async); each drop is also said in the log."},
		func() float64 { return float64(a.Dropped()) }))
	return a.Logger, a.Close, nil
}

// wire builds the allocator over proc. Whatever it built, even when it
// fails, close undoes.
func wire(ctx context.Context, cfg *config, proc *startup.Process, log *slog.Logger) (*wired, error) {
	w := &wired{}
	var err error
	// A JWKS that cannot be read stops the start: callers would all be
	// refused.
	authCfg := auth.Config{AdminTokens: splitList(cfg.token), ServiceTokens: splitList(cfg.serviceToken),
		PublicTokens: splitList(cfg.publicToken), JWKS: cfg.jwks, Issuer: cfg.jwtIssuer, Audience: cfg.jwtAudience,
		Refresh: cfg.jwksRefresh, Logger: log}
	if cfg.serviceCAs != nil {
		authCfg.ClientCAs = cfg.serviceCAs.Pool
	}
	if w.auth, err = auth.New(ctx, authCfg); err != nil {
		return w, err
	}
	// Not ready while etcd is behind the databases' fences (restored or
	// rebuilt): its moves and CreateSku would all be fenced.
	w.etcdCheck = startup.CheckEtcd(ctx, proc.DBs, proc.Etcd, log)
	watcher := topology.NewWatcher(proc.Etcd, stock.Partitions)
	w.watchDone = make(chan error, 1)
	go func() { w.watchDone <- watcher.Run(ctx) }()

	soldOut := topology.NewSoldOut(proc.Etcd, log)
	w.soldOutDone = make(chan error, 1)
	go func() { w.soldOutDone <- soldOut.Run(ctx) }()

	host, _ := os.Hostname()
	w.moves = topology.NewMoveLeases(proc.Etcd, fmt.Sprintf("allocator/%s/%d@%s", host, os.Getpid(), proc.Listener.Addr()), 0, log)
	var rctx context.Context
	rctx, w.stopReconciling = context.WithCancel(ctx)
	w.reconciled = make(chan struct{})
	go func() {
		defer close(w.reconciled)
		ledger.NewScheduler(ledger.SchedulerConfig{Store: proc.DBs, TryLease: w.moves.TryReconcile, Registerer: proc.Registry, Logger: log}).Run(rctx)
	}()
	acfg := allocator.Config{DB: proc.DBs, Topology: watcher.Snapshot, Logger: log, Registerer: proc.Registry, Moves: w.moves, SoldOut: soldOut,
		Rebalance: rebalance.Config{Off: !cfg.rebalance, Auto: rebalance.AutoShards{Off: !cfg.autoShards}, RetireGrace: cfg.retireGrace}}
	if main := proc.DBs.DB("main"); main != nil {
		acfg.Orders = main // orders live in main, whichever databases hold their lines' SKUs
	}
	if cfg.shardClientTLS != nil {
		acfg.HTTPClient, acfg.ShardScheme = transport.NewInternalTLSClient(cfg.shardClientTLS), "https"
	}
	if cfg.shardID != "" {
		if err := shardnode.CheckDurabilityAll(ctx, proc.DBs, cfg.requireSync, log); err != nil {
			return w, err
		}
		// The ShardService answers any caller: it gets a listener of its
		// own, as cmd/shard's, never the public port.
		if w.shardLis, err = net.Listen("tcp", cfg.shardAddr); err != nil {
			return w, fmt.Errorf("-shard-addr: %w", err)
		}
		if cfg.advertise == "" {
			cfg.advertise = w.shardLis.Addr().String()
		}
		w.node = shardnode.New(shardnode.Config{ID: cfg.shardID, Advertise: cfg.advertise, DBs: proc.DBs, Etcd: proc.Etcd,
			LeaseTTL: cfg.leaseTTL, Logger: log, Registry: proc.Registry, GroupDelay: cfg.groupDelay, EtcdCheck: w.etcdCheck})
		acfg.Local, acfg.LocalID = w.node.Server, cfg.shardID
	}
	w.alloc = allocator.New(acfg)
	if main := proc.DBs.DB("main"); main != nil {
		// Tickets live in main, like orders, whichever database holds
		// their SKU.
		w.admission = admission.New(main, w.alloc, proc.Registry)
		var actx context.Context
		actx, w.stopAdmission = context.WithCancel(ctx)
		w.admitted = make(chan struct{})
		worker := admission.NewWorker(w.admission, func(ctx context.Context, sku string) (admission.Lease, error) {
			l, err := w.moves.TryAdmission(ctx, sku)
			if l == nil {
				return nil, err
			}
			return l, nil
		}, 0, log)
		go func() { defer close(w.admitted); worker.Run(actx) }()
	}
	w.changes = ledger.NewStream(ledger.StreamConfig{Readers: proc.DBs.Readers(), Registerer: proc.Registry})
	return w, nil
}

// close stops the allocator and the scheduled reconciliation, then closes
// the shard listener and the move leases: the reverse of wire.
func (w *wired) close() {
	if w.admitted != nil {
		w.stopAdmission()
		<-w.admitted
	}
	if w.reconciled != nil {
		w.stopReconciling()
		<-w.reconciled
	}
	if w.alloc != nil {
		w.alloc.Close()
	}
	if w.shardLis != nil {
		w.shardLis.Close()
	}
	if w.moves != nil {
		w.moves.Close()
	}
}

// ready reports whether the allocator can serve: etcd is past the
// databases' fences and every partition has a live owner.
func (w *wired) ready() bool { return w.etcdCheck.Reason() == "" && w.alloc.Ready() }

// serve serves the operator listener, the local shard server if any and
// the public API until ctx ends or the public listener fails, then waits
// for all of them to stop.
func serve(ctx context.Context, cancel context.CancelFunc, cfg *config, proc *startup.Process, w *wired, log *slog.Logger, stdout io.Writer) error {
	opsLis, err := startup.Listen(ctx, cfg.operatorAddr)
	if err != nil {
		return fmt.Errorf("-operator-addr: %w", err)
	}
	defer opsLis.Close()
	opsDone := make(chan error, 1)
	go func() {
		opsDone <- transport.ServeTLS(ctx, opsLis, transport.NewMux(transport.MuxConfig{Gatherer: proc.Registry, Pprof: cfg.pprof, Ready: w.ready, Reason: w.etcdCheck.Reason}), cfg.tls)
	}()
	fmt.Fprintf(stdout, "operator listening on %s://%s\n", cfg.scheme, opsLis.Addr())
	metrics := transport.NewMetrics(proc.Registry)
	mux := publicMux(cfg, proc, w, metrics, log)
	nodeDone, shardDone := serveLocalShard(ctx, cancel, cfg, w, metrics, log, stdout)

	fmt.Fprintf(stdout, "allocator listening on %s://%s\n", cfg.scheme, proc.Listener.Addr())
	go readiness.Announce(ctx, stdout, readiness.Line{Role: readiness.RoleAllocator,
		Addr: cfg.scheme + "://" + proc.Listener.Addr().String(), Operator: cfg.scheme + "://" + opsLis.Addr().String()}, w.ready)
	log.Info("allocator started", "addr", proc.Listener.Addr().String())
	public := transport.LimitConns(proc.Listener, cfg.clientConns, transport.NewConnMetrics(proc.Registry, "shardstock_allocator_client"))
	serveErr := transport.ServeTLS(ctx, public, transport.CORS(mux, splitList(cfg.corsOrigins)), cfg.publicTLS)

	// Shut down: everything started above stops with ctx.
	cancel()
	serr, nerr, oerr := <-shardDone, <-nodeDone, <-opsDone
	<-w.watchDone
	<-w.soldOutDone
	log.Info("allocator stopped")
	return errors.Join(serveErr, serr, nerr, oerr)
}

// publicMux is the public listener's handler: the InventoryService and
// the AdminService, each behind its admission, and the dashboard. It has
// no /metrics and no /debug/pprof: those are on the operator listener.
func publicMux(cfg *config, proc *startup.Process, w *wired, metrics *transport.Metrics, log *slog.Logger) *http.ServeMux {
	mux := transport.NewMux(transport.MuxConfig{
		Services: []string{shardstockv1connect.InventoryServiceName, shardstockv1connect.AdminServiceName},
		Ready:    w.ready,
		Reason:   w.etcdCheck.Reason,
	})
	// Admission (who calls and whether their role may, their rate, bytes
	// read ahead, requests in flight) runs before Connect decodes a
	// request, so that a burst is shed at the transport's cost; its
	// refusals are counted in the call metrics too.
	admit := api.AdmitConfig{Auth: w.auth, Need: cfg.policy.Need, PerClient: cfg.rateLimit, PerCredential: cfg.serviceRateLimit,
		TrustedProxies: cfg.proxies, InFlight: cfg.inFlight, AheadBytes: int64(cfg.aheadBytes)}
	invPath, inv, invHandler := api.InventoryFront(&api.InventoryHandler{Inventory: w.alloc, Log: w.audit, Changes: w.changes, Admission: w.admission},
		admit, metrics)
	mux.Handle(invPath, inv)
	// A watch lasts as long as its client wants: it holds no place among
	// the requests in flight (the change stream bounds its watches) and no
	// kept goroutine. The AdminService has no in-flight bound either:
	// operators' calls are few.
	admit.InFlight = 0
	// A watch's sends are bounded (a consumer that stops reading is reset):
	// api.WatchWriter.
	mux.Handle(shardstockv1connect.InventoryServiceWatchStockProcedure, api.Admit(admit, api.WatchWriter(invHandler), metrics.Refused))
	mux.Handle(shardstockv1connect.InventoryServiceWatchTicketProcedure, api.Admit(admit, api.WatchWriter(invHandler), metrics.Refused))
	adminPath, adminHandler := shardstockv1connect.NewAdminServiceHandler(&api.AdminHandler{Admin: w.alloc, Placement: proc.DBs, Changes: w.changes, Catalog: proc.DBs, Warmer: w.alloc, Metrics: proc.Registry, SKUCalls: metrics.SKUs},
		append(transport.PublicHandlerOptions(), connect.WithInterceptors(metrics, api.AuditAdmin(log)))...)
	mux.Handle(adminPath, api.Admit(admit, adminHandler, metrics.Refused))
	mux.Handle(shardstockv1connect.AdminServiceWatchLedgerProcedure, api.Admit(admit, api.WatchWriter(adminHandler), metrics.Refused))
	mux.Handle("/", api.Dashboard())
	return mux
}

// serveLocalShard runs -shard-id's shard server and serves its listener
// until ctx ends; each channel receives the error each returned (nil at
// once without -shard-id). A shard listener that fails cancels ctx: a
// member others cannot reach must not stay one.
func serveLocalShard(ctx context.Context, cancel context.CancelFunc, cfg *config, w *wired, metrics *transport.Metrics, log *slog.Logger, stdout io.Writer) (nodeDone, shardDone chan error) {
	nodeDone, shardDone = make(chan error, 1), make(chan error, 1)
	if w.node == nil {
		nodeDone <- nil
		shardDone <- nil
		return nodeDone, shardDone
	}
	go func() { nodeDone <- w.node.Run(ctx) }()
	var localShard http.Handler = w.node.Handler(nil, false, metrics)
	if cfg.localTLS != nil {
		localShard = transport.RequireClientCert(localShard, "/"+shardstockv1connect.ShardServiceName+"/")
	}
	go func() {
		err := transport.ServeTLS(ctx, w.shardLis, localShard, cfg.localTLS)
		if err != nil {
			cancel()
		}
		shardDone <- err
	}()
	fmt.Fprintf(stdout, "shard %s listening on %s\n", cfg.shardID, w.shardLis.Addr())
	log.Info("shard server started", "id", cfg.shardID, "addr", w.shardLis.Addr().String(), "advertise", cfg.advertise, "in", "allocator")
	return nodeDone, shardDone
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

// clientConnsDefault bounds the public listener's connections
// (-max-client-conns): at about 16 KB an idle connection (client and
// server together, transport's BenchmarkIdleConnMemory), 8,192 hold about
// 130 MB of deploy/k8s's 512 MiB; a client multiplexes its calls over a
// few connections, so a fleet needs far fewer.
const clientConnsDefault = 8192
