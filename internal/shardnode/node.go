// Package shardnode wires a shard server into a process: the server, its
// member of the topology (etcd), its ShardService handler, and the check of
// the database's durability settings it makes before taking partitions.
// cmd/shard runs a node on its own; an allocator with -shard-id runs one
// beside itself.
package shardnode

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
)

// postgres.DB is the store a shard server writes through.
var _ shard.Store = (*postgres.DB)(nil)

// LeaseTTLDefault is a shard server's etcd lease TTL unless set: a dead
// server's partitions move after about this long.
const LeaseTTLDefault = 5 * time.Second

// Config configures a Node.
type Config struct {
	ID        string // unique among shard servers
	Advertise string // the address allocators dial
	DBs       *dbset.Set
	Etcd      *clientv3.Client
	LeaseTTL  time.Duration
	Logger    *slog.Logger
	Registry  prometheus.Registerer
	// GroupDelay is shard.Config.GroupDelay.
	GroupDelay time.Duration
	// EtcdCheck, if set, holds the node out of the topology until etcd's
	// revision is past the databases' fences (startup.CheckEtcd): before,
	// every partition it claimed would be refused by the databases.
	EtcdCheck EtcdCheck
}

// EtcdCheck is what a node needs of startup.EtcdCheck.
type EtcdCheck interface {
	Wait(ctx context.Context) error
	Reason() string
}

// Node is a shard server wired into a process: the server, its member of
// the topology and its ShardService handler. cmd/shard runs one on its own;
// an allocator started with -shard-id runs one beside itself.
type Node struct {
	Server *shard.Server
	member *topology.Member
	// drain is closed by Drain: the member leaves the topology; left is
	// closed once it has.
	drain     chan struct{}
	drainOnce sync.Once
	left      chan struct{}
	etcd      EtcdCheck
}

// New returns a node; Run starts it.
func New(cfg Config) *Node {
	stores := map[string]shard.Store{}
	for _, name := range cfg.DBs.Names() {
		stores[name] = cfg.DBs.DB(name)
	}
	srv := shard.New(shard.Config{ServerID: cfg.ID, DBs: stores, Locate: cfg.DBs.Locate, Logger: cfg.Logger, Registerer: cfg.Registry,
		GroupDelay: cfg.GroupDelay})
	return &Node{
		Server: srv,
		etcd:   cfg.EtcdCheck,
		drain:  make(chan struct{}),
		left:   make(chan struct{}),
		member: topology.NewMember(topology.MemberConfig{Client: cfg.Etcd, ServerID: cfg.ID, Addr: cfg.Advertise,
			LeaseTTL: cfg.LeaseTTL, Owner: srv, Logger: cfg.Logger}),
	}
}

// Handler returns the ShardService, through interceptors (the process's
// call metrics), with health, reflection and /metrics (of gatherer, if
// set), /readyz (ready while the node owns exactly the partitions assigned
// to it), /drain and, with pprof, /debug/pprof/. It authenticates no one
// itself: serve it on a port that only shardstock's own processes reach,
// never beside the public API, and with mTLS wrap it in
// transport.RequireClientCert.
func (n *Node) Handler(gatherer prometheus.Gatherer, pprof bool, interceptors ...connect.Interceptor) http.Handler {
	mux := transport.NewMux(transport.MuxConfig{Services: []string{shardstockv1connect.ShardServiceName}, Gatherer: gatherer, Pprof: pprof,
		Ready: n.Ready, Reason: n.Reason})
	opts := append(transport.HandlerOptions(), connect.WithInterceptors(interceptors...))
	path, h := shardstockv1connect.NewShardServiceHandler(&api.ShardHandler{Server: n.Server}, opts...)
	mux.Handle(path, transport.Warm(h, 0))
	mux.HandleFunc("/drain", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), drainTimeout)
		defer cancel()
		if err := n.Drain(ctx); err != nil {
			http.Error(w, "not drained: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "drained")
	})
	return mux
}

// GroupDelayUsage documents the -group-delay flag of both commands that
// run a shard server.
const GroupDelayUsage = "how long a group transaction that is not full waits for more shard batches before it is sent, " +
	"0 to 10ms: below the peak, less CPU per request (a group's fixed cost shared by more requests) for that much more latency; " +
	"a wait under 1ms lasts about 1ms when the process is otherwise idle, the Go runtime's timer resolution; measured in " +
	"docs/benchmarks.md; 0 sends at once (env SHARDSTOCK_GROUP_DELAY)"

// CheckGroupDelay refuses a -group-delay outside 0 to shard.GroupDelayMax.
func CheckGroupDelay(d time.Duration) error {
	if d < 0 || d > shard.GroupDelayMax {
		return fmt.Errorf("-group-delay %s: want 0 to %s", d, shard.GroupDelayMax)
	}
	return nil
}

// drainTimeout bounds a /drain call: leaving the topology is one etcd
// revoke after the batches in flight.
const drainTimeout = 20 * time.Second

// Drain leaves the topology now, as a stop does, and returns once the
// node's partitions are released (others take them at once) or ctx ends.
// The process keeps running, owning nothing and not ready, until it is
// stopped: a Kubernetes preStop hook (GET /drain on the shard port) hands
// the partitions over before the pod gets SIGTERM.
func (n *Node) Drain(ctx context.Context) error {
	n.drainOnce.Do(func() { close(n.drain) })
	select {
	case <-n.left:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready reports whether the node owns exactly the partitions assigned to
// it (topology.Member.Settled), etcd being ahead of the databases.
func (n *Node) Ready() bool { return n.Reason() == "" && n.member.Settled() }

// Reason says why the node is not ready, if etcd is the cause ("" else).
func (n *Node) Reason() string {
	if n.etcd == nil {
		return ""
	}
	return n.etcd.Reason()
}

// Run takes part in the topology and sweeps expiries until ctx ends, then
// leaves the topology (others take the partitions at once) and stops the
// writers.
func (n *Node) Run(ctx context.Context) error {
	sweepDone := make(chan error, 1)
	go func() { sweepDone <- n.Server.Run(ctx) }()
	mctx, leave := context.WithCancel(ctx)
	defer leave()
	go func() {
		select {
		case <-n.drain:
			leave()
		case <-mctx.Done():
		}
	}()
	var err error
	if n.etcd != nil {
		err = n.etcd.Wait(mctx)
	}
	if err == nil {
		err = n.member.Run(mctx)
	} else if ctx.Err() != nil || mctx.Err() != nil {
		err = nil // stopped or drained while waiting for etcd: nothing to leave
	}
	close(n.left)
	<-sweepDone
	return err
}
