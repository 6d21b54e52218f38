// Package shardnode wires a shard server into a process: the server, its
// member of the topology (etcd), its ShardService handler, and the check of
// the database's durability settings it makes before taking partitions.
// cmd/shard runs a node on its own; an allocator with -shard-id runs one
// beside itself.
package shardnode

import (
	"context"
	"log/slog"
	"net/http"
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
}

// Node is a shard server wired into a process: the server, its member of
// the topology and its ShardService handler. cmd/shard runs one on its own;
// an allocator started with -shard-id runs one beside itself.
type Node struct {
	Server *shard.Server
	member *topology.Member
}

// New returns a node; Run starts it.
func New(cfg Config) *Node {
	stores := map[string]shard.Store{}
	for _, name := range cfg.DBs.Names() {
		stores[name] = cfg.DBs.DB(name)
	}
	srv := shard.New(shard.Config{ServerID: cfg.ID, DBs: stores, Locate: cfg.DBs.Locate, Logger: cfg.Logger, Registerer: cfg.Registry})
	return &Node{
		Server: srv,
		member: topology.NewMember(topology.MemberConfig{Client: cfg.Etcd, ServerID: cfg.ID, Addr: cfg.Advertise,
			LeaseTTL: cfg.LeaseTTL, Owner: srv, Logger: cfg.Logger}),
	}
}

// Handler returns the ShardService, through interceptors (the process's
// call metrics), with health, reflection and /metrics (of gatherer, if
// set), /readyz (ready while the node owns exactly the partitions assigned
// to it) and, with pprof, /debug/pprof/. It has no authentication: serve it
// on a port that only shardstock's own processes reach, never beside the
// public API.
func (n *Node) Handler(gatherer prometheus.Gatherer, pprof bool, interceptors ...connect.Interceptor) http.Handler {
	mux := transport.NewMux(transport.MuxConfig{Services: []string{shardstockv1connect.ShardServiceName}, Gatherer: gatherer, Pprof: pprof,
		Ready: n.Ready})
	opts := append(transport.HandlerOptions(), connect.WithInterceptors(interceptors...))
	mux.Handle(shardstockv1connect.NewShardServiceHandler(&api.ShardHandler{Server: n.Server}, opts...))
	return mux
}

// Ready reports whether the node owns exactly the partitions assigned to
// it (topology.Member.Settled).
func (n *Node) Ready() bool { return n.member.Settled() }

// Run takes part in the topology and sweeps expiries until ctx ends, then
// leaves the topology (others take the partitions at once) and stops the
// writers.
func (n *Node) Run(ctx context.Context) error {
	sweepDone := make(chan error, 1)
	go func() { sweepDone <- n.Server.Run(ctx) }()
	err := n.member.Run(ctx)
	<-sweepDone
	return err
}
