package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth/authtest"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// Bounds of the fixture.
const (
	startTimeout = 60 * time.Second
	leaseTTL     = 2 * time.Second
	adminToken   = "e2e-admin-token-0123456789"
	// serviceToken is the service role's credential (the shop's
	// backends): every InventoryService call.
	serviceToken = "e2e-service-token-0123456789"
)

// asService is a client option that sends the service token.
var asService = authtest.Bearer(serviceToken)

// bin holds the binaries built once for the whole package.
var bin string

// besideStacksMax bounds the tests that run beside one another
// (besideOthers) at once: a stack holds up to 3 shard servers' 8
// Postgres connections and its allocator's 4 (newStackOpts), so two, with
// the tests' own, stay well inside a default Postgres's 100, on whatever
// number of cores (t.Parallel alone would run GOMAXPROCS of them).
const besideStacksMax = 2

var besideStacks = make(chan struct{}, besideStacksMax)

// besideOthers runs t beside the other tests that call it, at most
// besideStacksMax at once, after every test that does not (t.Parallel).
// Only a test that holds nothing another uses (its own stack, database,
// SKUs; no fixed port, no file, no environment variable) and asserts no
// timing that a neighbour's load could break may call it: fault tests,
// takeovers, load and overload tests run alone.
func besideOthers(t *testing.T) {
	t.Parallel()
	besideStacks <- struct{}{}
	t.Cleanup(func() { <-besideStacks }) // the first registered runs last: after the stack stops
}

// startCluster starts a throwaway Postgres cluster of the test's own (for a
// test that crashes or stops it), stopped when the test ends.
func startCluster(ctx context.Context, t *testing.T) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.Start(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

// e2eCommands are the commands the tests run, built with the failpoints
// into bin (the Makefile's test target builds the same list once for its
// two runs of this package).
var e2eCommands = []string{"shard", "allocator", "stockctl"}

func TestMain(m *testing.M) {
	if os.Getenv(etcdChildEnv) != "" {
		os.Exit(etcdChild())
	}
	// make test runs this package three times, up to two at once (its
	// first run, TEST_E2E_SECOND and TEST_E2E_BESIDE), and builds the
	// commands once for all, as below, into the directory
	// SHARDSTOCK_E2E_BIN names.
	if dir := os.Getenv("SHARDSTOCK_E2E_BIN"); dir != "" && os.Getenv("SHARDSTOCK_E2E_RACE") != "1" {
		for _, cmd := range e2eCommands {
			if _, err := os.Stat(filepath.Join(dir, cmd)); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: SHARDSTOCK_E2E_BIN=%s lacks %s (the Makefile's test target builds ./cmd/%s there): %v\n", dir, cmd, strings.Join(e2eCommands, ", ./cmd/"), err)
				os.Exit(1)
			}
		}
		bin = dir
		pgtest.Main(m)
		return
	}
	dir, err := os.MkdirTemp("", "shardstock-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	// The failpoints (internal/failpoint) are inert unless
	// a test sets their variable in a process's environment.
	args := []string{"build", "-tags", "shardstock_failpoints", "-o", dir + "/"}
	if os.Getenv("SHARDSTOCK_E2E_RACE") == "1" {
		args = append(args, "-race") // the processes report data races; cleanup fails the test on one
	}
	for _, cmd := range e2eCommands {
		args = append(args, "../../cmd/"+cmd)
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the commands:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	pgtest.Main(m)
}

// stack is one shardstock deployment of the test's own: a database, an
// etcd, shard-server processes and an allocator process.
type stack struct {
	t         *testing.T
	dbURL     string
	env       []string          // more environment of every process
	netns     map[string]string // process name -> the network namespace it runs in (ip netns exec)
	etcd      string
	shards    map[string]*proc
	allocator *proc
	localID   string // the allocator's own shard server (-shard-id), if any
	leaseTTL  time.Duration
	base      string // http://host:port of the allocator
	ops       string // http://host:port of its operator listener (/metrics)
	inv       shardstockv1connect.InventoryServiceClient
	admin     shardstockv1connect.AdminServiceClient
	procs     *procSet // every process started, restarted ones too
}

// procSet is the processes of one stack, which its cleanup stops together.
type procSet struct {
	mu  sync.Mutex
	all []*proc
}

// proc is one child process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	out  strings.Builder
}

func newStack(t *testing.T, shardServers int) *stack {
	t.Helper()
	return newStackWith(t, shardServers, "")
}

// newStackWith starts a stack whose allocator also runs a shard server of
// id localID in its own process (-shard-id), unless localID is "".
func newStackWith(t *testing.T, shardServers int, localID string) *stack {
	t.Helper()
	return newStackLease(t, shardServers, localID, leaseTTL)
}

// newStackLease is newStackWith with the shard servers' lease TTL ttl
// instead of leaseTTL.
func newStackLease(t *testing.T, shardServers int, localID string, ttl time.Duration) *stack {
	t.Helper()
	return newStackOpts(t, stackOpts{shardServers: shardServers, localID: localID, ttl: ttl})
}

// stackOpts shape a stack.
type stackOpts struct {
	shardServers int
	localID      string        // see newStackWith
	ttl          time.Duration // the shard servers' lease TTL
	allocArgs    []string      // more flags of the allocator
	allocEnv     []string      // more environment of the allocator
	dbURL        string        // the database named main; "": a new one of pgtest's
	etcd         string        // client URLs of an etcd of the test's own; "": a new embedded one
	etcdProcess  bool          // the new etcd in a process of its own (startEtcdProcess), not in the test's
	// startShards starts the shard servers instead of shardServers plain ones.
	startShards func(s *stack)
	env         []string          // more environment of every process
	netns       map[string]string // see stack.netns
}

func newStackOpts(t *testing.T, o stackOpts) *stack {
	t.Helper()
	switch {
	case o.etcd != "":
	case o.etcdProcess:
		o.etcd = startEtcdProcess(t)
	default:
		o.etcd = strings.Join(etcdtest.Start(t).Endpoints(), ",")
	}
	if o.dbURL == "" {
		o.dbURL = pgtest.NewMigratedDB(t)
	}
	if o.ttl == 0 {
		o.ttl = leaseTTL
	}
	s := &stack{t: t, dbURL: o.dbURL, env: o.env, netns: o.netns, etcd: o.etcd, shards: map[string]*proc{}, localID: o.localID, leaseTTL: o.ttl, procs: &procSet{}}
	if o.startShards != nil {
		o.startShards(s)
	}
	for i := 1; i <= o.shardServers; i++ {
		s.startShard(fmt.Sprintf("s%d", i))
	}
	conns := "4"
	args := []string{"-addr", "127.0.0.1:0", "-admin-token", adminToken, "-service-token", serviceToken, "-log-level", "warn"}
	if o.localID != "" {
		conns = "8" // shared with its shard server
		args = append(args, "-shard-id", o.localID, "-lease-ttl", o.ttl.String())
	}
	args = append(append(args, "-db-max-conns", conns), o.allocArgs...)
	s.allocator = s.startEnv("allocator", o.allocEnv, filepath.Join(bin, "allocator"), args...)
	ready := s.allocator.waitReady(t, readiness.RoleAllocator)
	s.base, s.ops = ready.Addr, ready.Operator
	hc := transport.NewClient()
	s.inv = shardstockv1connect.NewInventoryServiceClient(hc, s.base, asService)
	s.admin = shardstockv1connect.NewAdminServiceClient(hc, s.base)
	s.waitStable(startTimeout)
	return s
}

// as returns s as test t sees it: the same processes and clients, with
// t's failures and logs. The tests that share a stack (TestE2E_Shared)
// each use their own view, so that a failure fails the test that saw it.
func (s *stack) as(t *testing.T) *stack {
	view := *s
	view.t = t
	return &view
}

// waitStable waits until every partition is owned by the shard server
// rendezvous hashing assigns it among the live ones: start-up hand-overs
// are over.
func (s *stack) waitStable(timeout time.Duration) time.Duration {
	s.t.Helper()
	start := time.Now()
	for {
		var ids []string
		if s.localID != "" {
			ids = append(ids, s.localID)
		}
		for id, p := range s.shards {
			select {
			case <-p.done:
			default:
				ids = append(ids, id)
			}
		}
		want := topology.Assign(stock.Partitions, ids)
		resp, err := s.admin.GetTopology(context.Background(), adminReq(&v1.GetTopologyRequest{}))
		if err == nil && len(resp.Msg.Owners) == stock.Partitions {
			ok := true
			for _, o := range resp.Msg.Owners {
				ok = ok && want[o.Partition] == o.ServerId
			}
			if ok && s.ready() {
				return time.Since(start)
			}
		}
		if time.Since(start) > timeout {
			s.t.Fatalf("topology not stable within %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startShard starts (or restarts) shard server id.
func (s *stack) startShard(id string) *proc {
	p := s.start(id, filepath.Join(bin, "shard"), "-id", id, "-addr", "127.0.0.1:0", "-lease-ttl", s.leaseTTL.String(), "-db-max-conns", "8", "-log-level", "warn")
	s.shards[id] = p
	return p
}

func (s *stack) start(name, path string, args ...string) *proc {
	s.t.Helper()
	return s.startEnv(name, nil, path, args...)
}

// startEnv is start with env added to the process's environment.
func (s *stack) startEnv(name string, env []string, path string, args ...string) *proc {
	s.t.Helper()
	if ns := s.netns[name]; ns != "" {
		// ip execs the command once it has entered ns: one process, so
		// that the stack's signals (kill -9, SIGSTOP) reach it.
		args = append([]string{"netns", "exec", ns, path}, args...)
		path = "ip"
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(append(append(os.Environ(), "DATABASE_URL="+s.dbURL, "ETCD_ENDPOINTS="+s.etcd), s.env...), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		io.Copy(lockedWriter{p}, out)
		cmd.Wait()
		close(p.done)
	}()
	s.procs.mu.Lock()
	s.procs.all = append(s.procs.all, p)
	s.procs.mu.Unlock()
	s.t.Cleanup(func() {
		s.procs.stop() // the first of the stack's cleanups stops them all
		if strings.Contains(p.output(), "WARNING: DATA RACE") {
			s.t.Errorf("%s reported a data race", name)
		}
		// No secret in any process's output: the tokens are on every
		// allocator's command line and in every call.
		for _, secret := range []string{adminToken, serviceToken} {
			if strings.Contains(p.output(), secret) {
				s.t.Errorf("%s printed a token", name)
			}
		}
		if s.t.Failed() {
			s.t.Logf("%s output:\n%s", name, p.output())
		}
	})
	return p
}

type lockedWriter struct{ p *proc }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitLine waits for an output line with prefix and returns it.
func (p *proc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	return p.waitFor(t, fmt.Sprintf("line %q", prefix), func(l string) bool { return strings.HasPrefix(l, prefix) })
}

// waitReady waits for the process's readiness line (package readiness)
// as role and returns it: the process is ready, and says where it listens.
func (p *proc) waitReady(t *testing.T, role string) readiness.Line {
	t.Helper()
	l, _ := readiness.Parse(p.waitFor(t, "readiness line of role "+role, func(l string) bool {
		r, ok := readiness.Parse(l)
		return ok && r.Role == role
	}))
	return l
}

// waitFor waits for an output line that match accepts and returns it.
func (p *proc) waitFor(t *testing.T, what string, match func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(p.output()))
		for sc.Scan() {
			if match(sc.Text()) {
				return sc.Text()
			}
		}
		select {
		case <-p.done:
			t.Fatalf("process exited before printing a %s:\n%s", what, p.output())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no %s within %s:\n%s", what, startTimeout, p.output())
	return ""
}

// stop stops every process of the set at once (SIGTERM), and waits for
// them as proc.stop does. One after another, each shard server that left
// handed its partitions to those still running, which took them over in
// etcd and Postgres only to leave in turn: seconds of a loaded machine's
// two cores per stack, for nothing.
func (ps *procSet) stop() {
	ps.mu.Lock()
	all := slices.Clone(ps.all)
	ps.mu.Unlock()
	for _, p := range all {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range all {
		p.waitStopped()
	}
}

// procStopTimeout is how long a signalled process may take to exit before
// it is killed: its graceful stop (rpc's shutdownTimeout, 10 s) and room.
const procStopTimeout = 15 * time.Second

// stop signals the process and waits for it (SIGKILL after procStopTimeout).
func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	p.waitStopped()
}

// waitStopped waits for the process to exit, and kills it after
// procStopTimeout.
func (p *proc) waitStopped() {
	select {
	case <-p.done:
	case <-time.After(procStopTimeout):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// ready reports whether the allocator says every partition is owned.
func (s *stack) ready() bool {
	resp, err := http.Get(s.base + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func adminReq[T any](msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Bearer "+adminToken)
	return req
}

// createSKU creates a SKU through the admin API.
func (s *stack) createSKU(sku string, initial int64, shards int32, opts ...func(*v1.CreateSkuRequest)) {
	s.t.Helper()
	m := &v1.CreateSkuRequest{Sku: sku, InitialStock: initial, Shards: shards}
	for _, o := range opts {
		o(m)
	}
	if _, err := s.admin.CreateSku(context.Background(), adminReq(m)); err != nil {
		s.t.Fatalf("CreateSku(%s) = %v", sku, err)
	}
}

// stock returns a SKU's counts through the public API.
func (s *stack) stock(sku string) *v1.Stock {
	s.t.Helper()
	resp, err := s.inv.GetStock(context.Background(), connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
	if err != nil {
		s.t.Fatalf("GetStock(%s) = %v", sku, err)
	}
	return resp.Msg.Stock
}

// reconcile fails the test unless Reconcile says the books balance.
func (s *stack) reconcile(sku string) {
	s.t.Helper()
	resp, err := s.admin.Reconcile(context.Background(), adminReq(&v1.ReconcileRequest{Sku: sku}))
	if err != nil {
		s.t.Fatalf("Reconcile(%s) = %v", sku, err)
	}
	if !resp.Msg.Balanced {
		for _, d := range resp.Msg.Discrepancies {
			s.t.Errorf("discrepancy: %v", d)
		}
		s.t.FailNow()
	}
}

// deduct calls Deduct.
func (s *stack) deduct(ctx context.Context, sku, key string, q int64) (*v1.DeductResponse, error) {
	resp, err := s.inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: q, IdempotencyKey: key}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// reason returns an error's ErrorInfo reason.
func reason(err error) string { return wire.Reason(err) }

// parallel runs f(i) for i in [0, n) concurrently, bounded by timeout.
func parallel(t *testing.T, n int, timeout time.Duration, f func(i int)) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(i) }()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("parallel(%d) did not finish within %s", n, timeout)
	}
}
