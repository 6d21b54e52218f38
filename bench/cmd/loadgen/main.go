// Command loadgen drives shardstock and the baselines it is measured against
// with the source document's traffic models (A, B, C, the 100-unit case) and
// checkout carts (model cart), with duplicate submissions and abandoned
// requests on demand, and ends every
// run with the correctness line: oversold, undersold, duplicate deductions
// and reconciliation differences. A non-zero number on shardstock makes the
// command exit non-zero; a baseline is reported as it is.
//
//	loadgen -target all-baselines -model C -concurrency 64 -duration 10s
//	loadgen -target shardstock,onerow -model case -report report.html
//	loadgen -stack bin/shardstock-dev -target all -model C,case -duration 5s
//
// With -stack it starts the dev stack itself (on a free port, with a new
// admin token, a new service token its load calls with, and a database of
// its own) and stops it with SIGTERM at the end; -paced reruns a target at
// a share of the rate it reached, to measure latency below the peak.
// -target memory measures the ceiling of the public API over Connect: an
// in-memory server (internal/loadgen/memory) that loadgen runs as a child
// process of itself (`loadgen serve-memory`) and drives with the shardstock
// client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardstock/shardstock/bench/internal/baseline"
	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/diskprobe"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if len(os.Args) > 1 && os.Args[1] == serveMemoryArg {
		err = serveMemory(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
	} else if len(os.Args) > 1 && os.Args[1] == serveRedisAPIArg {
		err = serveRedisAPI(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
	} else {
		err = run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	}
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// options are what the target constructors need.
type options struct {
	addr, adminToken, serviceToken string
	databaseURL, redisAddr         string
	pgConns                        int32
	redisPool                      int
	prewarm                        bool
}

// targets builds each target by name. Tests add their own.
var targets = map[string]func(options) loadgen.Target{
	"shardstock": func(o options) loadgen.Target {
		return shardstock.New(shardstock.Config{Addr: o.addr, AdminToken: o.adminToken, ServiceToken: o.serviceToken, Prewarm: o.prewarm})
	},
	"naive": func(o options) loadgen.Target {
		return baseline.NewNaive(baseline.PostgresConfig{DatabaseURL: o.databaseURL, MaxConns: o.pgConns})
	},
	"onerow": func(o options) loadgen.Target {
		return baseline.NewOneRow(baseline.PostgresConfig{DatabaseURL: o.databaseURL, MaxConns: o.pgConns})
	},
	"subrows": func(o options) loadgen.Target {
		return baseline.NewSubRows(baseline.PostgresConfig{DatabaseURL: o.databaseURL, MaxConns: o.pgConns})
	},
	"redis": func(o options) loadgen.Target {
		return baseline.NewRedis(baseline.RedisConfig{Addr: o.redisAddr, PoolSize: o.redisPool})
	},
	"redis-fsync": func(o options) loadgen.Target {
		return baseline.NewRedis(baseline.RedisConfig{Addr: o.redisAddr, PoolSize: o.redisPool, Fsync: true})
	},
	loadgen.CeilingTarget: newMemoryTarget,
	redisAPIName:          newRedisAPITarget,
	redisAPIBareName:      newRedisAPIBareTarget,
}

// groups name several targets at once, in the order they run.
var groups = map[string][]string{
	"all-baselines": {"naive", "onerow", "subrows", "redis", "redis-fsync"},
	"all":           {"naive", "onerow", "subrows", "redis", "redis-fsync", "shardstock"},
}

// Bounds of the command.
const (
	modelsMax = 8 // models of one invocation
	pacedMin  = 0.01
	pacedMax  = 1.0
	// pacedRateMax is the runner's own bound on -rate.
	pacedRateMax = 1_000_000
	cpuProfile   = "loadgen" // name of the client's own CPU profile in -server-profile
)

// parseTargets expands a comma-separated list of targets and groups.
func parseTargets(s string) ([]string, error) {
	var names []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		members, ok := groups[n]
		if !ok {
			if _, ok := targets[n]; !ok {
				return nil, fmt.Errorf("unknown target %q (want shardstock, naive, onerow, subrows, redis, redis-fsync, redis-api, redis-api-bare, memory, all-baselines or all)", n)
			}
			members = []string{n}
		}
		for _, m := range members {
			if !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	return names, nil
}

// shardCountsMax bounds the -shards list.
const shardCountsMax = 8

// parseShards parses a comma-separated list of shard counts, 1 to 256 each.
func parseShards(s string) ([]int32, error) {
	var out []int32
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-shards %q: want counts of 1 to 256, comma-separated", s)
		}
		if !slices.Contains(out, int32(n)) {
			out = append(out, int32(n))
		}
	}
	if len(out) > shardCountsMax {
		return nil, fmt.Errorf("-shards: at most %d counts", shardCountsMax)
	}
	return out, nil
}

// parseModels parses a comma-separated list of models.
func parseModels(s string) ([]loadgen.Model, error) {
	var ms []loadgen.Model
	for _, part := range strings.Split(s, ",") {
		m, err := loadgen.ParseModel(strings.TrimSpace(part))
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ms, m) {
			ms = append(ms, m)
		}
	}
	if len(ms) > modelsMax {
		return nil, fmt.Errorf("-model: at most %d models", modelsMax)
	}
	return ms, nil
}

// config is every flag of run, as given.
type config struct {
	targetList, addr, adminToken, databaseURL, redisAddr, modelList string
	serviceToken                                                    string
	duration, timeout, latencyGoal, pgCrashEvery                    time.Duration
	requests, stockPerSKU                                           int64
	concurrency, skus, pgConns, redisPool, pgCrashCount, interleave int
	rate, paced, dupRate, abandonRate                               float64
	pacedTargets, shardList, qty, mix                               string
	retry, progress, prewarm                                        bool
	seed                                                            uint64
	reportPath, stackBin, databaseNote, stackLog, stackArgs         string
	serverProf, serverPids, cpuProf, diskProbe, pgData              string
	drop                                                            dropFlags
}

// parseConfig reads the flags; the environment gives the defaults of
// those that name a variable. The two variables are strings, read with
// getenv: internal/cmd/startup's EnvDefaults would do the same and bring
// its dependencies (goose, automemlimit) into this module.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.targetList, "target", "all-baselines", "comma-separated targets: shardstock, naive, onerow, subrows, redis, redis-fsync, redis-api (the same API, handlers and front as the allocator's over a Redis Lua script with appendfsync always, in a process of its own; in no group), redis-api-bare (redis-api without the front: no caller checked, no call counted; in no group), memory (the API's ceiling: an in-memory server in a process of its own, driven like shardstock; in no group); or all-baselines, all")
	fs.StringVar(&c.addr, "addr", shardstock.AddrDefault, "shardstock allocator base URL (cleartext HTTP/2)")
	fs.StringVar(&c.adminToken, "admin-token", getenv("SHARDSTOCK_ADMIN_TOKEN"), "shardstock admin bearer token (default $SHARDSTOCK_ADMIN_TOKEN)")
	fs.StringVar(&c.serviceToken, "service-token", getenv("SHARDSTOCK_SERVICE_TOKEN"), "shardstock service bearer token, for the InventoryService (default $SHARDSTOCK_SERVICE_TOKEN); empty: -admin-token's, and the allocator logs each stock call at info")
	fs.StringVar(&c.databaseURL, "database-url", getenv("DATABASE_URL"), "Postgres URL of the baselines (default $DATABASE_URL); with -stack, the server the stack's database is created on")
	fs.StringVar(&c.redisAddr, "redis-addr", "127.0.0.1:6379", "Redis address of the Redis baselines")
	fs.StringVar(&c.modelList, "model", "A", "comma-separated traffic models, run one after the other, a table each: A (uniform), B (20% of SKUs get 80%), C (one 100-unit SKU gets 70%), skew (as A, but every key's first-choice shard is one of 2), case (100 units, 500 deducts, 50 reused keys), cart (orders of 2 to 5 lines, 4 hot SKUs get half the lines, 10% refunded; shardstock only), drop (a SKU of -drop-units under admission, -requests RequestTokens (default 10,000) at -rate a second (default 5,000), against a plain Reserve phase and, after the sell-out, the in-memory ceiling; -stack and -target shardstock only)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "load time per target (at most 1h); the run stops at -duration or -requests, whichever comes first")
	fs.Int64Var(&c.requests, "requests", 0, "client operations per target (0: until -duration; at most 10,000,000)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "concurrent clients")
	fs.Float64Var(&c.rate, "rate", 0, "client operations started per second over all clients (a deduct, or a reserve with its commit or release); 0: unpaced")
	fs.Float64Var(&c.paced, "paced", 0, "after each unpaced run of a -paced-targets target, run it again at this share (0.01 to 1) of the operations per second it reached; 0: off")
	fs.StringVar(&c.pacedTargets, "paced-targets", "shardstock", "comma-separated targets that -paced reruns")
	fs.StringVar(&c.shardList, "shards", "8", "shards per SKU (shardstock) and rows per SKU (subrows); a comma-separated list runs every target once per count, its rows labelled target/count")
	fs.Int64Var(&c.stockPerSKU, "stock", 1_000_000, "stock per SKU (the hot SKU of model C and the case have 100)")
	fs.IntVar(&c.skus, "skus", 1000, "number of SKUs (models A, B, C)")
	fs.StringVar(&c.qty, "qty", "1", "quantity per request: N, or 1..K for uniform")
	fs.StringVar(&c.mix, "mix", "deduct=100", "flows: deduct=N,commit=N,release=N (reserve then commit, reserve then release)")
	fs.Float64Var(&c.dupRate, "dup-rate", 0, "share of requests sent twice at once with the same key")
	fs.Float64Var(&c.abandonRate, "abandon-rate", 0, "share of requests abandoned right after sending, then retried with the same key until a definite answer")
	fs.BoolVar(&c.retry, "retry", true, "retry a request whose answer left its fate unknown (timeout, SHARD_UNAVAILABLE, ...) with the same key, up to 20 times, as the API asks of clients")
	fs.DurationVar(&c.timeout, "request-timeout", 10*time.Second, "deadline of each request")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of every random choice")
	fs.IntVar(&c.pgConns, "pg-conns", 50, "connection pool size of each Postgres baseline")
	fs.IntVar(&c.redisPool, "redis-pool", 128, "connection pool size of each Redis baseline")
	fs.BoolVar(&c.prewarm, "prewarm", false, "shardstock: once the SKUs are created, start their shard writers (AdminService.Prewarm), as an operator does before a sale (docs/operations.md); default: each shard's first request reads its row")
	fs.StringVar(&c.reportPath, "report", "", "write an HTML report to this path (with several models, one per model: path-MODEL.html)")
	fs.BoolVar(&c.progress, "progress", true, "show a progress bar on stderr")
	fs.StringVar(&c.stackBin, "stack", "", "start this shardstock-dev binary on 127.0.0.1 (free port, new admin and service tokens, a database of its own) for the run, and stop it with SIGTERM after; -addr, -admin-token and -service-token are then ignored")
	fs.StringVar(&c.databaseNote, "database-note", "", "with -stack and -database-url, how the tables name that server (e.g. \"private durable Postgres 15\")")
	fs.StringVar(&c.stackLog, "stack-log", "", "with -stack, write the stack's output here (default: a file in the temporary directory)")
	fs.StringVar(&c.stackArgs, "stack-args", "", "with -stack, the stack's own flags, space-separated (e.g. \"-shard-servers 0 -allocator-shard\": one process owning every partition)")
	fs.StringVar(&c.serverProf, "server-profile", "", "with -stack, write CPU profiles of the allocator and every shard server over each shardstock load, and of loadgen itself, into this directory")
	fs.StringVar(&c.serverPids, "server-pids", "", "comma-separated pids of shardstock's server processes when it was not started with -stack (their children count too), for the CPU each request costs the server side")
	fs.StringVar(&c.cpuProf, "cpuprofile", "", "write loadgen's own CPU profile (the whole invocation) to this file")
	fs.DurationVar(&c.latencyGoal, "latency-goal", 25*time.Millisecond, "answers slower than this are kept and, with -disk-probe, matched against the disk's stalls (a sync this slow is a stall); 0: off")
	fs.StringVar(&c.diskProbe, "disk-probe", "", "during each run's load, time an 8 KiB write and fdatasync every 5 ms in this directory (put it on the database's disk), and report the disk's stalls beside the answers they delayed")
	fs.StringVar(&c.pgData, "pg-data", "", "with -pg-crash-count, the data directory of the private Postgres that -database-url names, to crash-restart during each shardstock load (never the shared server on port 5432)")
	fs.DurationVar(&c.pgCrashEvery, "pg-crash-every", 5*time.Second, "with -pg-crash-count, the time from the load's start to the first Postgres crash-restart and from one to the next (at least 1s; and at least 1s after Postgres answered again)")
	fs.IntVar(&c.pgCrashCount, "pg-crash-count", 0, "crash-restart the Postgres of -pg-data this many times during each shardstock load (pg_ctl stop -m immediate, then start on the same port), every -pg-crash-every; fewer crashes than this fail the command; 0: off")
	fs.IntVar(&c.interleave, "interleave", 0, "run each model's targets in turns: every target is set up, then loads for -duration/N in each of N rounds, the order reversed every other round, and is verified at the end; its CPU per request is over all its windows. The machine's drift then falls on every target alike: the ratios are steadier than from one stretch each (not with -paced, -disk-probe, -pg-crash-count, -server-profile, -requests, models case and drop, or redis with another Redis target). Every target stays set up the whole time: each Postgres baseline holds its -pg-conns connections at once; 0: off")
	c.drop.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, nil
}

// plan is what the flags ask for, checked: the targets and models to run
// and the runner's configuration they share.
type plan struct {
	names, pacedNames []string
	models            []loadgen.Model
	shards            []int32
	base              loadgen.Config
	crash             *crashPlan // nil: no crash loop
}

// check refuses a configuration that cannot work, every one of them
// before anything starts, and returns the plan.
func (c *config) check(stderr io.Writer) (*plan, error) {
	p, err := c.parseLists()
	if err != nil {
		return nil, err
	}
	if err := c.checkBounds(); err != nil {
		return nil, err
	}
	p.base = loadgen.Config{
		SKUs: c.skus, Stock: c.stockPerSKU, Shards: p.shards[0],
		Duration: c.duration, Requests: c.requests, Concurrency: c.concurrency, Rate: c.rate,
		Qty: p.base.Qty, Mix: p.base.Mix, DupRate: c.dupRate, AbandonRate: c.abandonRate, Retry: c.retry,
		RequestTimeout: c.timeout, Seed: c.seed, LatencyGoal: c.latencyGoal,
	}
	if c.diskProbe != "" {
		if c.latencyGoal <= 0 {
			return nil, errors.New("-disk-probe needs a positive -latency-goal: it is the probe's stall threshold")
		}
		if fi, err := os.Stat(c.diskProbe); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("-disk-probe %s: want an existing directory", c.diskProbe)
		}
	}
	if err := c.checkInterleave(p); err != nil {
		return nil, err
	}
	if c.pgCrashCount != 0 {
		if p.crash, err = newCrashPlan(c.pgData, c.databaseURL, c.pgCrashEvery, c.pgCrashCount, c.duration, p.models, p.names); err != nil {
			return nil, err
		}
	} else if c.pgData != "" {
		return nil, errors.New("-pg-data needs -pg-crash-count")
	}
	if c.progress {
		p.base.Progress = stderr
	}
	for _, m := range p.models {
		if m == loadgen.ModelDrop {
			if err := c.checkDrop(); err != nil {
				return nil, err
			}
			continue
		}
		for _, n := range p.shards {
			rc := p.base
			rc.Model, rc.Shards = m, n
			if _, err := loadgen.NewRunner(rc); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// parseLists parses the flags that are lists or small languages: the
// targets, the models, the shard counts, the quantities and the mix.
func (c *config) parseLists() (*plan, error) {
	p := &plan{}
	var err error
	if p.names, err = parseTargets(c.targetList); err != nil {
		return nil, err
	}
	if c.paced != 0 {
		if !(c.paced >= pacedMin && c.paced <= pacedMax) {
			return nil, fmt.Errorf("-paced %g: want %g to %g, or 0", c.paced, pacedMin, pacedMax)
		}
		if p.pacedNames, err = parseTargets(c.pacedTargets); err != nil {
			return nil, err
		}
	}
	if p.models, err = parseModels(c.modelList); err != nil {
		return nil, err
	}
	if p.base.Qty, err = loadgen.ParseQty(c.qty); err != nil {
		return nil, err
	}
	if p.base.Mix, err = loadgen.ParseMix(c.mix); err != nil {
		return nil, err
	}
	if p.shards, err = parseShards(c.shardList); err != nil {
		return nil, err
	}
	return p, nil
}

// checkBounds refuses numbers out of range and flags that need another.
func (c *config) checkBounds() error {
	if c.pgConns < 1 || c.pgConns > 1000 || c.redisPool < 1 || c.redisPool > 10_000 {
		return fmt.Errorf("-pg-conns (1 to 1000) or -redis-pool (1 to 10000) out of range")
	}
	// The runner reads zero as "default": refuse it here.
	if c.duration <= 0 || c.concurrency < 1 || c.skus < 1 || c.stockPerSKU < 1 || c.requests < 0 || c.timeout <= 0 {
		return fmt.Errorf("-duration, -concurrency, -skus, -stock and -request-timeout must be positive, -requests not negative")
	}
	if c.stackArgs != "" && c.stackBin == "" {
		return errors.New("-stack-args needs -stack")
	}
	if c.serverProf != "" && c.stackBin == "" {
		return errors.New("-server-profile needs -stack: only a stack loadgen starts serves its profiles")
	}
	return nil
}

// run parses and checks the flags, starts the stack if asked, runs every
// model and writes its table; its error is every failure joined.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	p, err := c.check(stderr)
	if err != nil {
		return err
	}
	if c.cpuProf != "" {
		stopProf, err := startCPUProfile(c.cpuProf)
		if err != nil {
			return err
		}
		defer stopProf()
	}
	opts := options{
		addr: c.addr, adminToken: c.adminToken, serviceToken: c.serviceToken, databaseURL: c.databaseURL, redisAddr: c.redisAddr,
		pgConns: int32(c.pgConns), redisPool: c.redisPool, prewarm: c.prewarm,
	}
	st, stop, err := c.launchStack(ctx, &opts, stderr)
	defer stop()
	if err != nil {
		return err
	}
	pids, err := parseServerPids(c.serverPids)
	if err != nil {
		return err
	}
	var errs []error
	var cmp cartComparison
	for _, m := range p.models {
		if m == loadgen.ModelDrop {
			errs = append(errs, c.runDrop(ctx, opts, st, stdout, stderr))
			continue
		}
		cfg := p.base
		cfg.Model = m
		mr := modelRun{cfg: cfg, names: p.names, shards: p.shards, paced: c.paced, pacedNames: p.pacedNames, opts: opts, stack: st,
			profileDir: c.serverProf, diskDir: c.diskProbe, crash: p.crash, serverPids: pids, stderr: stderr}
		var results []*loadgen.Result
		var merrs []error
		if c.interleave > 1 {
			results, merrs = mr.runInterleaved(ctx, c.interleave)
		} else {
			results, merrs = mr.run(ctx)
		}
		errs = append(errs, merrs...)
		if len(results) == 0 {
			continue
		}
		cmp.add(results)
		if err := c.writeTable(stdout, st, results); err != nil {
			return err
		}
		if err := c.writeModelReport(stderr, m, len(p.models) > 1, results); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, failures(m, results)...)
	}
	cmp.write(stdout)
	return errors.Join(errs...)
}

// cartComparison holds, from the models of one invocation, shardstock's
// unpaced run of deducts only and its run of the cart model: on the same
// stack (-stack), they give an order line's server CPU against a deduct's.
type cartComparison struct {
	deducts, cart *loadgen.Result
}

func (cc *cartComparison) add(results []*loadgen.Result) {
	for _, r := range results {
		if r.Target != "shardstock" || r.Config.Rate != 0 || r.CPU == nil || r.CPU.Err != nil {
			continue
		}
		switch mix := r.Config.Mix; {
		case r.Config.Model == loadgen.ModelCart && r.Cart != nil && r.Cart.Lines > 0:
			cc.cart = r
		case r.Config.Model != loadgen.ModelCase && mix.Commit == 0 && mix.Release == 0 && r.OK > 0:
			cc.deducts = r
		}
	}
}

// write prints the comparison when both runs are there.
func (cc *cartComparison) write(w io.Writer) {
	if cc.deducts == nil || cc.cart == nil {
		return
	}
	d, k := cc.deducts, cc.cart
	perLine := (k.CPU.Server / time.Duration(k.Cart.Lines)).Round(time.Microsecond)
	perDeduct := (d.CPU.Server / time.Duration(d.Requests)).Round(time.Microsecond)
	fmt.Fprintf(w, "cart against deducts (shardstock, model %s, same stack): server CPU per order line %s, per deduct %s: %.2fx; %.0f order lines/s, %.0f deducts/s: %.2fx\n",
		d.Config.Model, perLine, perDeduct, float64(perLine)/float64(perDeduct),
		float64(k.Cart.Lines)/k.Elapsed.Seconds(), d.Throughput(), float64(k.Cart.Lines)/k.Elapsed.Seconds()/d.Throughput())
}

// launchStack starts the -stack stack, if asked, and points opts at it;
// with -server-profile it profiles loadgen too, unless -cpuprofile does.
// The returned func stops what it started; it is never nil, and is to be
// called even when launchStack fails.
func (c *config) launchStack(ctx context.Context, opts *options, stderr io.Writer) (*stack, func(), error) {
	var stops []func()
	stop := func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	if c.stackBin == "" {
		return nil, stop, nil
	}
	st, err := startStack(ctx, stackConfig{
		Bin: c.stackBin, ServerURL: c.databaseURL, ServerNote: c.databaseNote, BaselineConns: c.pgConns, LogPath: c.stackLog,
		Args:  strings.Fields(c.stackArgs),
		Pprof: c.serverProf != "", Stderr: stderr,
	})
	if err != nil {
		return nil, stop, fmt.Errorf("stack: %w", err)
	}
	stops = append(stops, func() {
		if err := st.stop(); err != nil {
			fmt.Fprintf(stderr, "loadgen: stack: %v\n", err)
		}
	})
	opts.addr, opts.adminToken, opts.serviceToken, opts.databaseURL = st.baseURL, st.token, st.serviceToken, st.databaseURL
	fmt.Fprintf(stderr, "loadgen: stack: %s, admin token %s, %s; log %s\n", st.baseURL, st.token, st.dbNote, st.logPath)
	if c.serverProf != "" {
		if err := os.MkdirAll(c.serverProf, 0o755); err != nil {
			return st, stop, err
		}
		if c.cpuProf == "" {
			stopProf, err := startCPUProfile(filepath.Join(c.serverProf, cpuProfile+".pprof"))
			if err != nil {
				return st, stop, err
			}
			stops = append(stops, stopProf)
		}
	}
	return st, stop, nil
}

// parseServerPids parses -server-pids.
func parseServerPids(s string) ([]int, error) {
	var pids []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("-server-pids: %q is not a pid", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// writeTable writes one model's table to stdout, under the stack's line.
func (c *config) writeTable(stdout io.Writer, st *stack, results []*loadgen.Result) error {
	if st != nil {
		fmt.Fprintf(stdout, "stack: %s%s\n", st.dbNote, argsNote(c.stackArgs))
	}
	if err := loadgen.WriteTable(stdout, results); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	return nil
}

// writeModelReport writes model m's HTML report, if -report asks for one;
// with several models each has its own file.
func (c *config) writeModelReport(stderr io.Writer, m loadgen.Model, several bool, results []*loadgen.Result) error {
	if c.reportPath == "" {
		return nil
	}
	path := c.reportPath
	if several {
		path = strings.TrimSuffix(path, ".html") + "-" + string(m) + ".html"
	}
	if err := writeReport(path, results); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "loadgen: report written to %s\n", path)
	return nil
}

// failures are model m's results that fail the command: a correctness
// figure not zero, or fewer Postgres crash-restarts than planned.
func failures(m loadgen.Model, results []*loadgen.Result) []error {
	var errs []error
	for _, r := range results {
		if r.Failed() {
			c := r.Correctness
			errs = append(errs, fmt.Errorf("%s (model %s): correctness not zero: oversold %d, undersold %d, duplicates %d, lost acknowledged %d, reconciliation differences %d",
				r.Target, m, c.Oversold, c.Undersold, c.Duplicates, c.Lost, c.Reconciliation))
		}
		if r.Crashes.Short() {
			errs = append(errs, fmt.Errorf("%s (model %s): %d of %d planned Postgres crash-restarts happened: not the run under faults it was asked to be",
				r.Target, m, r.Crashes.Done, r.Crashes.Planned))
		}
	}
	return errs
}

// modelRun runs every target on one model.
type modelRun struct {
	cfg        loadgen.Config
	names      []string
	shards     []int32
	paced      float64
	pacedNames []string
	opts       options
	stack      *stack
	profileDir string
	diskDir    string     // "": no disk probe
	crash      *crashPlan // nil: no crash loop
	serverPids []int      // -server-pids: shardstock's processes when not -stack
	stderr     io.Writer
}

func (mr *modelRun) run(ctx context.Context) ([]*loadgen.Result, []error) {
	var results []*loadgen.Result
	var errs []error
	for _, name := range mr.names {
		for _, n := range mr.shards {
			cfg := mr.cfg
			cfg.Shards = n
			label := name
			if len(mr.shards) > 1 {
				label = fmt.Sprintf("%s/%d", name, n)
			}
			res, err := mr.one(ctx, name, cfg, label)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			results = append(results, res)
			if mr.paced == 0 || !slices.Contains(mr.pacedNames, name) || cfg.Rate > 0 {
				continue
			}
			// The case model is a fixed 500 requests, over before it is paced.
			if cfg.Model == loadgen.ModelCase || res.FlowRate() <= 0 {
				continue
			}
			cfg.Rate = min(mr.paced*res.FlowRate(), pacedRateMax)
			pres, err := mr.one(ctx, name, cfg, fmt.Sprintf("%s@%.0f%%", label, mr.paced*100))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			results = append(results, pres)
		}
	}
	return results, errs
}

// one runs one target once; label names its row.
func (mr *modelRun) one(ctx context.Context, name string, cfg loadgen.Config, label string) (*loadgen.Result, error) {
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%s: not run: %w", label, ctx.Err())
	}
	if mr.stack != nil {
		if err := mr.stack.alive(); err != nil {
			return nil, fmt.Errorf("%s: not run: %w", label, err)
		}
	}
	var prof *serverProfiles
	if mr.profileDir != "" && name == "shardstock" {
		prof = &serverProfiles{dir: mr.profileDir, prefix: fmt.Sprintf("%s-%s", cfg.Model, strings.ReplaceAll(label, "%", "pct")),
			seconds: int(cfg.Duration.Round(time.Second) / time.Second), stack: mr.stack, stderr: mr.stderr}
		cfg.LoadStarted = prof.start
	}
	var disk *loadgen.Disk
	if mr.diskDir != "" {
		cfg.LoadStarted, cfg.LoadEnded = mr.diskHooks(cfg.LatencyGoal, cfg.LoadStarted, cfg.LoadEnded, &disk)
	}
	var cpu *loadgen.CPU
	var t loadgen.Target
	cfg.LoadStarted, cfg.LoadEnded = mr.cpuHooks(ctx, name, func() loadgen.Target { return t }, cfg.LoadStarted, cfg.LoadEnded, &cpu)
	var crashes *loadgen.Crashes
	if mr.crash != nil && name == "shardstock" {
		cfg.LoadStarted, cfg.LoadEnded = mr.crash.hooks(ctx, cfg.LoadStarted, cfg.LoadEnded, &crashes, mr.stderr)
	}
	runner, err := loadgen.NewRunner(cfg)
	if err != nil {
		return nil, err
	}
	rate := ""
	if cfg.Rate > 0 {
		rate = fmt.Sprintf(", paced at %.0f ops/s", cfg.Rate)
	}
	fmt.Fprintf(mr.stderr, "loadgen: %s: model %s, %d clients%s\n", label, cfg.Model, cfg.Concurrency, rate)
	t = targets[name](mr.opts)
	res, err := runner.Run(ctx, t)
	if res != nil {
		res.Disk, res.Crashes, res.CPU = disk, crashes, cpu
	}
	if cerr := t.Close(); cerr != nil {
		fmt.Fprintf(mr.stderr, "loadgen: %s: close: %v\n", label, cerr)
	}
	if prof != nil {
		prof.wait()
	}
	if err != nil {
		fmt.Fprintf(mr.stderr, "loadgen: %s: %v\n", label, err)
		return nil, err
	}
	res.Target = label
	fmt.Fprintf(mr.stderr, "loadgen: %s: setup %s, load %s, verify %s\n", label,
		res.SetupTime.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond), res.VerifyTime.Round(time.Millisecond))
	return res, nil
}

// diskHooks wraps a run's load hooks to probe the disk of mr.diskDir, a
// sync slower than threshold being a stall, into *out. The probe covers
// the load alone, not Setup's or Verify's writes.
func (mr *modelRun) diskHooks(threshold time.Duration, started, ended func(), out **loadgen.Disk) (func(), func()) {
	var probe *diskprobe.Probe
	return func() {
			if started != nil {
				started()
			}
			var err error
			if probe, err = diskprobe.Start(mr.diskDir, 0, threshold); err != nil {
				*out = &loadgen.Disk{Dir: mr.diskDir, Threshold: threshold, Err: err}
			}
		}, func() {
			if ended != nil {
				ended()
			}
			if probe != nil {
				*out = diskResult(probe.Stop())
			}
		}
}

// diskResult is the probe's record in the table's terms.
func diskResult(p *diskprobe.Result) *loadgen.Disk {
	d := &loadgen.Disk{Dir: p.Dir, Syncs: p.Syncs, Threshold: p.Threshold, StallsDropped: p.StallsDropped, Err: p.Err}
	if p.Syncs > 0 {
		us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
		d.P50, d.P99, d.Max = us(p.Latency.ValueAtQuantile(50)), us(p.Latency.ValueAtQuantile(99)), us(p.Latency.Max())
	}
	for _, s := range p.Stalls {
		d.Stalls = append(d.Stalls, loadgen.Window{Start: s.Start, End: s.End()})
	}
	return d
}

// startCPUProfile profiles this process into path until the returned func
// is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func writeReport(path string, results []*loadgen.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := loadgen.WriteReport(f, results); err != nil {
		f.Close()
		return fmt.Errorf("report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// argsNote names the stack's own flags in the table's stack line.
func argsNote(args string) string {
	if args = strings.Join(strings.Fields(args), " "); args != "" {
		return ", stack flags " + args
	}
	return ""
}
