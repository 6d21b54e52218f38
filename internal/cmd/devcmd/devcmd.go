// Package devcmd is `make run`: the whole stack on one machine in the
// foreground. It starts Postgres (DATABASE_URL, else a throwaway cluster
// from the local binaries) and etcd (ETCD_ENDPOINTS, else embedded), then
// three shard servers and an allocator as child processes (the same binary,
// re-executed with a role), creates a demo SKU and prints how to use it.
// Ctrl-C or SIGTERM stops all of it and leaves no process behind; so does
// SIGKILL on Linux, where the children have a parent-death signal.
package devcmd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/cmd/allocatorcmd"
	"github.com/shardstock/shardstock/internal/cmd/shardcmd"
	"github.com/shardstock/shardstock/internal/cmd/startup"
	"github.com/shardstock/shardstock/internal/etcdembed"
	"github.com/shardstock/shardstock/internal/freeport"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/proc"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// Bounds of the dev stack.
const (
	readyTimeout = 90 * time.Second
	// stopTimeout is how long a child may take to stop after SIGTERM
	// before it gets SIGKILL: a shard server's graceful stop is bounded
	// by its HTTP shutdown (10 s) and its writers' drain.
	stopTimeout = 15 * time.Second
	// signalGrace is how long a child's exit waits for this process's own
	// signal before it counts as a failure (a signal to the process group
	// reaches every process at once).
	signalGrace = time.Second
	demoSKU     = "demo-sku"
	demoStock   = 1000
	demoShards  = 8
	// Pool sizes that fit the stack (3 x 16 + 8) in a default Postgres
	// (max_connections = 100) with room to spare. An allocator with its own
	// shard server gets a shard server's pool.
	devShardConns     = "16"
	devAllocatorConns = "8"
	// localShardID is the id of -allocator-shard's shard server.
	localShardID = "allocator-shard"
)

// Run runs the dev stack, or one of its roles ("shard", "allocator") when
// args start with one. It reads its configuration, starts what it was not
// given (Postgres clusters, etcd), starts the shard servers and the
// allocator, waits for them, creates the demo SKU and prints the banner,
// then serves until ctx ends or a child exits; it stops everything it
// started, the children first.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "shard":
			return shardcmd.Run(ctx, args[1:], getenv, stdout, stderr)
		case "allocator":
			return allocatorcmd.Run(ctx, args[1:], getenv, stdout, stderr)
		}
	}
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	var deps adapters
	defer deps.stop()
	if err := deps.start(ctx, cfg, stderr); err != nil {
		return err
	}
	kids := newChildren(ctx, cfg.servers+1)
	defer kids.stop()
	if err := startStack(kids, cfg, stderr); err != nil {
		return err
	}

	base := "http://" + cfg.addr
	topo, err := waitReady(ctx, base, cfg.token, cfg.members(), kids)
	if err != nil {
		if ctx.Err() != nil { // stopped during start-up
			fmt.Fprintln(stderr, "dev: stopping")
			return nil
		}
		return err
	}
	if err := createDemo(ctx, base, cfg.token); err != nil {
		return err
	}
	printBanner(stdout, base, cfg)
	if err := announce(ctx, stdout, base, cfg, topo); err != nil {
		return err
	}
	return serve(ctx, kids, stderr)
}

// config is the dev stack's configuration: its flags, each with its
// environment variable (if it has one) as its default.
type config struct {
	addr, opsAddr      string
	servers, databases int
	local              bool
	token, service     string
	dbURL, moreDBs     string
	etcd               string
}

// parseConfig reads the flags. An empty admin or service token becomes a
// random one.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	env := startup.NewEnvDefaults(getenv)
	fs := flag.NewFlagSet("shardstock-dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", env.String("SHARDSTOCK_ADDR", "127.0.0.1:8080"), "allocator listen address (env SHARDSTOCK_ADDR)")
	fs.IntVar(&c.servers, "shard-servers", 3, "shard servers to start, each a process of its own")
	fs.StringVar(&c.opsAddr, "operator-addr", env.String("SHARDSTOCK_OPERATOR_ADDR", ""), "the allocator's operator listener (/metrics, /debug/pprof/); empty: a free port on 127.0.0.1, printed (env SHARDSTOCK_OPERATOR_ADDR)")
	fs.IntVar(&c.databases, "databases", 1, "Postgres databases to place SKUs on: main (-database-url, or a throwaway cluster) and db2..dbN, each a throwaway cluster of its own (unless -more-databases names them)")
	fs.BoolVar(&c.local, "allocator-shard", false, "also run a shard server (id "+localShardID+") inside the allocator's process, called without RPC; with -shard-servers 0 it owns every partition")
	fs.StringVar(&c.token, "admin-token", env.String("SHARDSTOCK_ADMIN_TOKEN", ""), "bearer token of the admin API; empty: a random one, printed (env SHARDSTOCK_ADMIN_TOKEN)")
	fs.StringVar(&c.service, "service-token", env.String("SHARDSTOCK_SERVICE_TOKEN", ""), "bearer token of the service role (every InventoryService call); empty: a random one, printed (env SHARDSTOCK_SERVICE_TOKEN)")
	fs.StringVar(&c.dbURL, "database-url", env.String("DATABASE_URL", ""), "Postgres URL of the database named main; empty: a throwaway cluster from the local PostgreSQL binaries (env DATABASE_URL)")
	fs.StringVar(&c.moreDBs, "more-databases", env.String("SHARDSTOCK_DATABASES", ""), "the databases besides main, as the allocator's -databases: comma-separated name=URL pairs; empty: -databases decides (env SHARDSTOCK_DATABASES)")
	fs.StringVar(&c.etcd, "etcd-endpoints", env.String("ETCD_ENDPOINTS", ""), "comma-separated etcd endpoints; empty: an embedded etcd (env ETCD_ENDPOINTS)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := env.Err(); err != nil {
		return nil, err
	}
	if c.servers < 0 || (c.servers == 0 && !c.local) {
		return nil, errors.New("-shard-servers: at least 1, or 0 with -allocator-shard")
	}
	if c.databases < 1 || c.databases > 8 {
		return nil, errors.New("-databases: 1 to 8")
	}
	if c.token == "" {
		c.token = randomToken()
	}
	if c.service == "" {
		c.service = randomToken()
	}
	return c, nil
}

// members is how many shard servers the stack has, the allocator's own
// included.
func (c *config) members() int {
	if c.local {
		return c.servers + 1
	}
	return c.servers
}

// adapters are the Postgres clusters and the etcd the dev stack started
// because it was given none.
type adapters struct {
	clusters []*pgcluster.Cluster
	etcd     *etcdembed.Server
}

// start starts a throwaway cluster for main without -database-url, one for
// each of db2..dbN without -more-databases, and an embedded etcd without
// -etcd-endpoints; it fills cfg in with their addresses.
func (a *adapters) start(ctx context.Context, cfg *config, stderr io.Writer) error {
	if cfg.dbURL == "" {
		fmt.Fprintln(stderr, "dev: DATABASE_URL is not set: starting a throwaway Postgres cluster")
		c, err := pgcluster.Start(ctx, "")
		if err != nil {
			return fmt.Errorf("no Postgres: set DATABASE_URL, or install the PostgreSQL server (Debian: apt-get install postgresql): %w", err)
		}
		a.clusters = append(a.clusters, c)
		cfg.dbURL = c.URL()
	}
	if cfg.moreDBs == "" && cfg.databases > 1 {
		var pairs []string
		for i := 2; i <= cfg.databases; i++ {
			fmt.Fprintf(stderr, "dev: starting a throwaway Postgres cluster for database db%d\n", i)
			c, err := pgcluster.Start(ctx, "")
			if err != nil {
				return fmt.Errorf("database db%d: %w", i, err)
			}
			a.clusters = append(a.clusters, c)
			pairs = append(pairs, fmt.Sprintf("db%d=%s", i, c.URL()))
		}
		cfg.moreDBs = strings.Join(pairs, ",")
	}
	dbs, err := startup.Databases(cfg.dbURL, cfg.moreDBs)
	if err != nil {
		return err
	}
	if cfg.etcd != "" {
		return nil
	}
	if a.etcd, err = etcdembed.Start(ctx, ""); err != nil {
		return fmt.Errorf("embedded etcd: %w", err)
	}
	cfg.etcd = strings.Join(a.etcd.Endpoints(), ",")
	// A new etcd counts revisions, and so epochs, from 1 again.
	for name, url := range dbs {
		if err := resetFences(ctx, url); err != nil {
			return fmt.Errorf("database %q: %w", name, err)
		}
	}
	return nil
}

// stop stops what start started, in reverse.
func (a *adapters) stop() {
	if a.etcd != nil {
		a.etcd.Close()
	}
	for _, c := range slices.Backward(a.clusters) {
		c.Stop()
	}
}

// startStack starts the shard servers and the allocator as children: this
// binary, re-executed with a role, the settings in their environment. The
// allocator's operator listener gets a free port unless -operator-addr
// names one.
func startStack(kids *children, cfg *config, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env := append(shareCores(childEnv(os.Environ()), cfg.servers+1, runtime.NumCPU()),
		"DATABASE_URL="+cfg.dbURL, "SHARDSTOCK_DATABASES="+cfg.moreDBs, "ETCD_ENDPOINTS="+cfg.etcd, "SHARDSTOCK_ADMIN_TOKEN="+cfg.token, "SHARDSTOCK_SERVICE_TOKEN="+cfg.service)
	for i := 1; i <= cfg.servers; i++ {
		id := fmt.Sprintf("shard-%d", i)
		if err := kids.start(self, env, stderr, id, "shard", "-id", id, "-addr", "127.0.0.1:0", "-db-max-conns", devShardConns); err != nil {
			return err
		}
	}
	if cfg.opsAddr == "" {
		if cfg.opsAddr, err = freeport.Addr(); err != nil {
			return err
		}
	}
	conns, own := devAllocatorConns, []string(nil)
	if cfg.local {
		conns, own = devShardConns, []string{"-shard-id", localShardID}
	}
	allocArgs := append([]string{"allocator", "-addr", cfg.addr, "-db-max-conns", conns, "-operator-addr", cfg.opsAddr}, own...)
	return kids.start(self, env, stderr, "allocator", allocArgs...)
}

// printBanner says where the stack is and how to use it.
func printBanner(stdout io.Writer, base string, cfg *config) {
	fmt.Fprintf(stdout, `shardstock is running at %[1]s (dashboard: %[1]s/#token=%[2]s; metrics: http://%[4]s/metrics)
admin token: %[2]s
service token: %[5]s
try:
  curl -s -X POST -H 'Content-Type: application/json' -H 'Authorization: Bearer %[5]s' -d '{"sku":"%[3]s","quantity":1,"idempotencyKey":"order-1"}' %[1]s/shardstock.v1.InventoryService/Deduct
  curl -s -X POST -H 'Content-Type: application/json' -d '{"sku":"%[3]s"}' %[1]s/shardstock.v1.InventoryService/GetStock
Ctrl-C stops everything.
`, base, cfg.token, demoSKU, cfg.opsAddr, cfg.service)
}

// announce prints the stack's readiness line, the banner's counterpart for
// a program (loadgen, the tests): its addresses and its shard servers.
func announce(ctx context.Context, stdout io.Writer, base string, cfg *config, topo *v1.GetTopologyResponse) error {
	line := readiness.Line{Role: readiness.RoleDev, Addr: base, Operator: "http://" + cfg.opsAddr}
	for _, srv := range topo.Servers {
		if srv.ServerId != localShardID { // inside the allocator's process
			line.Shards = append(line.Shards, readiness.Shard{ID: srv.ServerId, Addr: "http://" + srv.Address})
		}
	}
	if err := readiness.Announce(ctx, stdout, line, nil); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// serve waits until ctx ends or a child exits. A terminal's Ctrl-C
// reaches the children too, and one may exit before this process has seen
// its own SIGINT: a child's exit is a failure only if no signal follows it
// within signalGrace.
func serve(ctx context.Context, kids *children, stderr io.Writer) error {
	select {
	case <-ctx.Done():
	case name := <-kids.exited:
		select {
		case <-ctx.Done():
		case <-time.After(signalGrace):
			return fmt.Errorf("%s exited", name)
		}
	}
	fmt.Fprintln(stderr, "dev: stopping")
	return nil
}

// resetFences clears the partitions' epochs of the stack's database (it
// migrates it first if it is new).
func resetFences(ctx context.Context, url string) error {
	db, err := postgres.Open(ctx, url, postgres.Options{MaxConns: 1, ApplicationName: "shardstock-dev"})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.ResetFences(ctx)
}

func randomToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// children are the stack's processes. They stop when the context they
// were started under ends, or at stop: each gets SIGTERM, and SIGKILL if
// it has not exited within stopTimeout (internal/proc). On Linux each also
// gets SIGKILL from the kernel if this process dies first, so that no way
// of ending the stack, SIGKILL included, leaves a server holding the port.
type children struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// exited receives each child's name when it exits; its capacity is
	// the number of children, so that no child's wait blocks on it.
	exited chan string
}

// newChildren returns room for n children that stop when ctx ends.
func newChildren(ctx context.Context, n int) *children {
	ctx, cancel := context.WithCancel(ctx)
	return &children{ctx: ctx, cancel: cancel, exited: make(chan string, n)}
}

// start starts one child whose output goes to w, each line prefixed by
// its name.
func (k *children) start(self string, env []string, w io.Writer, name string, args ...string) error {
	cmd := proc.Command(k.ctx, syscall.SIGTERM, stopTimeout, self, args...)
	cmd.Env = env
	// SIGKILL if this process dies first (a crash, SIGKILL), so that no
	// way of ending the stack leaves a server holding the port.
	cmd.DieWithParent(syscall.SIGKILL)
	out := &prefixWriter{w: w, prefix: "[" + name + "] "}
	// One writer for both: exec copies them in one goroutine.
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		err := cmd.Wait()
		out.flush()
		if st := cmd.ProcessState; st != nil && k.ctx.Err() != nil && proc.Killed(st) {
			fmt.Fprintf(w, "dev: %s: %v\n", name, err)
		}
		k.exited <- name
	}()
	return nil
}

// stop stops every child and waits for them: at most stopTimeout, and
// the time SIGKILL takes.
func (k *children) stop() {
	k.cancel()
	k.wg.Wait()
}

// prefixWriter writes each complete line to w, prefixed, in one Write so
// that the lines of concurrent children do not interleave. It is not safe
// for concurrent use: exec copies a child's output in one goroutine.
type prefixWriter struct {
	w       io.Writer
	prefix  string
	partial []byte // the last line, not yet ended
}

// prefixLineMax bounds a line kept waiting for its end; longer lines are
// written in pieces.
const prefixLineMax = 64 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.partial = append(p.partial, b...)
			if len(p.partial) >= prefixLineMax {
				p.flush()
			}
			break
		}
		line := append(append([]byte(p.prefix), p.partial...), b[:i+1]...)
		p.partial = p.partial[:0]
		p.w.Write(line)
		b = b[i+1:]
	}
	return n, nil
}

// flush writes an unended last line.
func (p *prefixWriter) flush() {
	if len(p.partial) > 0 {
		p.w.Write(append(append([]byte(p.prefix), p.partial...), '\n'))
		p.partial = p.partial[:0]
	}
}

// waitReady waits until every shard server has registered and every
// partition is owned, so that start-up hand-overs are over when the banner
// says the stack is ready, and returns the topology then.
func waitReady(ctx context.Context, base, token string, servers int, k *children) (*v1.GetTopologyResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	for {
		req := connect.NewRequest(&v1.GetTopologyRequest{})
		req.Header().Set("Authorization", "Bearer "+token)
		if resp, err := admin.GetTopology(ctx, req); err == nil && len(resp.Msg.Servers) == servers &&
			len(resp.Msg.Owners) == int(resp.Msg.Partitions) && ownedByAll(resp.Msg) {
			return resp.Msg, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the stack was not ready within %s", readyTimeout)
		case name := <-k.exited:
			return nil, fmt.Errorf("%s exited during start-up", name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ownedByAll reports whether every partition is owned by the server that
// rendezvous hashing assigns it among the registered ones.
func ownedByAll(t *v1.GetTopologyResponse) bool {
	ids := make([]string, len(t.Servers))
	for i, s := range t.Servers {
		ids[i] = s.ServerId
	}
	want := topology.Assign(int(t.Partitions), ids)
	for _, o := range t.Owners {
		if want[o.Partition] != o.ServerId {
			return false
		}
	}
	return true
}

// childEnv is the environment without the per-process settings of a shard
// server or allocator, which the dev stack sets itself.
func childEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "SHARDSTOCK_ADVERTISE", "SHARDSTOCK_SERVER_ID", "SHARDSTOCK_SHARD_ADDR", "SHARDSTOCK_ADDR", "SHARDSTOCK_LOCAL_SHARD_ID":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// shareCores gives each of procs processes an equal share of cpus cores
// (GOMAXPROCS, at least 1) unless env sets GOMAXPROCS already: the stack's
// processes share one machine, and each Go runtime sized for every core
// spins for cores its neighbours need (docs/benchmarks.md measured it on
// two cores). A deployment gives each process a CPU limit of its own, from
// which Go sizes GOMAXPROCS; this is that, for one machine.
func shareCores(env []string, procs, cpus int) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return env
		}
	}
	return append(env, "GOMAXPROCS="+strconv.Itoa(max(1, cpus/max(1, procs))))
}

// createDemo creates the demo SKU unless it exists.
func createDemo(ctx context.Context, base, token string) error {
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	req := connect.NewRequest(&v1.CreateSkuRequest{Sku: demoSKU, InitialStock: demoStock, Shards: demoShards})
	req.Header().Set("Authorization", "Bearer "+token)
	_, err := admin.CreateSku(ctx, req)
	if err != nil && wire.Reason(err) != string(stock.CodeSKUExists) {
		return fmt.Errorf("create demo sku: %w", err)
	}
	return nil
}
