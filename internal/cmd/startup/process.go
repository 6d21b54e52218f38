package startup

import (
	"context"
	"net"
	"os"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/postgres"
)

// Process is what every shardstock server process opens: its database
// (migrated), an etcd client, its listener and a metrics registry with the
// Go and process collectors.
type Process struct {
	DB       *postgres.DB
	Etcd     *clientv3.Client
	Listener net.Listener
	Registry *prometheus.Registry
}

// gcPercentDefault is the garbage collector's target when GOGC is not set.
// A server's live heap is small (tens of MB) and every request allocates;
// at Go's default of 100 the collector took 15% of an allocator's CPU under
// load (docs/benchmarks.md). 400 trades some memory for most of that.
const gcPercentDefault = 400

// Open opens a Process; on error it closes what it opened. It also sets the
// garbage collector's target to gcPercentDefault unless GOGC says otherwise.
func Open(ctx context.Context, dbURL string, dbOpts postgres.Options, etcdEndpoints, addr string) (*Process, error) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercentDefault)
	}
	p := &Process{}
	var err error
	if p.DB, err = postgres.Open(ctx, dbURL, dbOpts); err != nil {
		return nil, err
	}
	if p.Etcd, err = Etcd(etcdEndpoints); err != nil {
		p.Close()
		return nil, err
	}
	if p.Listener, err = Listen(ctx, addr); err != nil {
		p.Close()
		return nil, err
	}
	p.Registry = prometheus.NewRegistry()
	p.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		poolCollector{p.DB})
	return p, nil
}

// poolCollector reports the Postgres pool's state: connections in use and
// their bound, and the acquires that had to wait for one (a pool too small
// for the load shows there first).
type poolCollector struct{ db *postgres.DB }

var (
	poolConns = prometheus.NewDesc("shardstock_db_pool_connections", "Postgres pool connections by state: acquired, idle, max.", []string{"state"}, nil)
	poolWaits = prometheus.NewDesc("shardstock_db_pool_waits_total", "Acquires that waited for a connection (none was idle).", nil, nil)
	poolWait  = prometheus.NewDesc("shardstock_db_pool_wait_seconds_total", "Time spent waiting for a connection, all acquires.", nil, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolConns
	ch <- poolWaits
	ch <- poolWait
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.db.PoolStat()
	ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.AcquiredConns()), "acquired")
	ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.IdleConns()), "idle")
	ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.MaxConns()), "max")
	ch <- prometheus.MustNewConstMetric(poolWaits, prometheus.CounterValue, float64(st.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(poolWait, prometheus.CounterValue, st.EmptyAcquireWaitTime().Seconds())
}

// Close closes the etcd client and the database (the listener is the
// server's to close).
func (p *Process) Close() {
	if p.Etcd != nil {
		p.Etcd.Close()
	}
	if p.DB != nil {
		p.DB.Close()
	}
}
