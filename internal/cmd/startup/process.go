package startup

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// Process is what every shardstock server process opens: its databases
// (migrated) and the placement of SKUs on them, an etcd client, its
// listener and a metrics registry with the Go and process collectors.
type Process struct {
	DBs      *dbset.Set
	Etcd     *clientv3.Client
	Listener net.Listener
	Registry *prometheus.Registry
	stop     context.CancelFunc // the placement's watch
	closeP   func()             // the placement lock's session
}

// MigrateUsage documents -migrate-url and -migrate-databases.
const MigrateUsage = "URL of the schema's owner for the database named main: migrations run as that role, which grants the service's role (DATABASE_URL's) only SELECT and INSERT on the ledger, so the service can never rewrite it; empty: the service's own role migrates and owns the schema (env SHARDSTOCK_MIGRATE_URL)"

// MigrateDatabasesUsage documents -migrate-databases.
const MigrateDatabasesUsage = "the owners' URLs of the databases of -databases, as name=URL pairs, as -migrate-url is main's (env SHARDSTOCK_MIGRATE_DATABASES)"

// WithMigrateURLs returns the options to open each database of dbs with:
// opts, with the owner's URL of mainURL (-migrate-url) for main and of
// more ("name=url,...") for the others. A name that is not a database of
// dbs is an error.
func WithMigrateURLs(opts postgres.Options, dbs map[string]string, mainURL, more string) (map[string]postgres.Options, error) {
	urls, err := Databases(mainURL, more)
	if err != nil && (mainURL != "" || more != "") {
		return nil, fmt.Errorf("-migrate-url, -migrate-databases: %w", err)
	}
	out := map[string]postgres.Options{}
	for name := range dbs {
		o := opts
		o.MigrateURL = urls[name]
		out[name] = o
	}
	for name := range urls {
		if _, ok := dbs[name]; !ok {
			return nil, fmt.Errorf("-migrate-databases: %q is not a database of -databases", name)
		}
	}
	return out, nil
}

// DatabasesUsage documents -databases.
const DatabasesUsage = "more Postgres databases SKUs are placed on, as comma-separated name=URL pairs (name: a-z, 0-9, - and _); DATABASE_URL is the database named main; new SKUs go where AdminService.SetPlacement says (env SHARDSTOCK_DATABASES)"

// Databases returns the databases of a process by name: mainURL (may be
// empty) as stock.DefaultDatabase and more as "name=url,...".
func Databases(mainURL, more string) (map[string]string, error) {
	out := map[string]string{}
	if mainURL != "" {
		out[stock.DefaultDatabase] = mainURL
	}
	for _, item := range strings.Split(more, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, u, ok := strings.Cut(item, "=")
		if !ok || u == "" {
			return nil, fmt.Errorf("-databases: %q is not name=URL", redact(item))
		}
		if err := stock.ValidateDatabases([]string{name}); err != nil {
			return nil, fmt.Errorf("-databases: %v", err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("-databases: database %q given twice", name)
		}
		out[name] = u
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no database: set -database-url or DATABASE_URL (and -databases or SHARDSTOCK_DATABASES for more)")
	}
	return out, nil
}

// redact hides a URL's password in an error message.
func redact(s string) string {
	name, raw, _ := strings.Cut(s, "=")
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxx")
			return name + "=" + u.String()
		}
	}
	return s
}

// gcPercentDefault is the garbage collector's target when GOGC is not set.
// A server's live heap is small (tens of MB) and every request allocates,
// so at Go's default of 100 the collector runs often and takes a large
// share of an allocator's CPU under load (measured: docs/bench-log/2026-12-02.md,
// "GOGC 400"). 400 trades some memory for most of that.
const gcPercentDefault = 400

// Open opens a Process; on error it closes what it opened. It also sets the
// garbage collector's target to gcPercentDefault unless GOGC says otherwise,
// and a soft memory limit of 90% of the container's (cgroup's) unless
// GOMEMLIMIT says otherwise: at GOGC 400 the heap may grow to five times
// what is live, and an overload burst (TestE2E_Overload) took an
// allocator past its pod's 512 MiB; near the soft limit the collector runs
// more often instead.
// dbs are the databases by name (Databases), each opened with its own
// dbOpts (WithMigrateURLs): its own pool of MaxConns. The placement of SKUs on them is read from etcd, or
// created there over dbs by the first process to start, and watched.
func Open(ctx context.Context, dbs map[string]string, dbOpts map[string]postgres.Options, etcd EtcdConfig, addr string, log *slog.Logger) (*Process, error) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercentDefault)
	}
	if limit, err := memlimit.Set(); err != nil {
		log.Warn("could not read the container's memory limit; no soft memory limit", "err", err)
	} else if limit != math.MaxInt64 {
		log.Info("soft memory limit", "GOMEMLIMIT", limit)
	}
	p := &Process{}
	var err error
	opened := map[string]*postgres.DB{}
	closeAll := func() {
		for _, db := range opened {
			db.Close()
		}
	}
	names := make([]string, 0, len(dbs))
	for name := range dbs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		db, err := postgres.Open(ctx, dbs[name], dbOpts[name])
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("database %q: %w", name, err)
		}
		opened[name] = db
	}
	if p.Etcd, err = EtcdTLS(etcd); err != nil {
		closeAll()
		return nil, err
	}
	// The placement etcd has, or the newest the databases recorded if etcd
	// lost it; then recorded in every database that lacks it.
	recorded, err := dbset.Recorded(ctx, opened)
	var placements *topology.Placements
	if err == nil {
		placements, err = topology.LoadPlacements(ctx, p.Etcd, names, recorded, log)
	}
	if err == nil {
		p.DBs, err = dbset.New(opened, placements)
	}
	if err == nil {
		p.DBs.SetLogger(log)
		err = p.DBs.Record(ctx)
	}
	if err != nil {
		if placements != nil {
			placements.Close()
		}
		closeAll()
		p.Etcd.Close()
		return nil, err
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stop, p.closeP = stop, placements.Close
	go placements.Watch(wctx)
	if p.Listener, err = Listen(ctx, addr); err != nil {
		p.Close()
		return nil, err
	}
	p.Registry = prometheus.NewRegistry()
	p.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		poolCollector{p.DBs})
	return p, nil
}

// poolCollector reports the Postgres pool's state: connections in use and
// their bound, and the acquires that had to wait for one (a pool too small
// for the load shows there first).
type poolCollector struct{ dbs *dbset.Set }

var (
	poolConns = prometheus.NewDesc("shardstock_db_pool_connections", "Postgres pool connections by database and state: acquired, idle, max.", []string{"database", "state"}, nil)
	poolWaits = prometheus.NewDesc("shardstock_db_pool_waits_total", "Acquires that waited for a connection (none was idle), by database.", []string{"database"}, nil)
	poolWait  = prometheus.NewDesc("shardstock_db_pool_wait_seconds_total", "Time spent waiting for a connection, all acquires, by database.", []string{"database"}, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolConns
	ch <- poolWaits
	ch <- poolWait
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.dbs.Names() {
		st := c.dbs.DB(name).PoolStat()
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.AcquiredConns()), name, "acquired")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.IdleConns()), name, "idle")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.MaxConns()), name, "max")
		ch <- prometheus.MustNewConstMetric(poolWaits, prometheus.CounterValue, float64(st.EmptyAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolWait, prometheus.CounterValue, st.EmptyAcquireWaitTime().Seconds(), name)
	}
}

// Close closes the etcd client and the database (the listener is the
// server's to close).
func (p *Process) Close() {
	if p.stop != nil {
		p.stop()
	}
	if p.closeP != nil {
		p.closeP()
	}
	if p.Etcd != nil {
		p.Etcd.Close()
	}
	if p.DBs != nil {
		for _, name := range p.DBs.Names() {
			p.DBs.DB(name).Close()
		}
	}
}
