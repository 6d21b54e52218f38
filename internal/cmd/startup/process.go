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
	p.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return p, nil
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
