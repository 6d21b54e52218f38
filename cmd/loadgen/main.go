// Command loadgen drives shardstock and the baselines it is measured against
// with the source document's traffic models (A, B, C and the 100-unit case),
// with duplicate submissions and abandoned requests on demand, and ends every
// run with the correctness line: oversold, undersold, duplicate deductions
// and reconciliation differences. A non-zero number on shardstock makes the
// command exit non-zero; a baseline is reported as it is.
//
//	loadgen -target all-baselines -model C -concurrency 64 -duration 10s
//	loadgen -target shardstock,onerow -model case -report report.html
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shardstock/shardstock/internal/baseline"
	"github.com/shardstock/shardstock/internal/loadgen"
	"github.com/shardstock/shardstock/internal/loadgen/shardstock"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
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
	addr, adminToken, databaseURL, redisAddr string
	pgConns                                  int32
	redisPool                                int
}

// targets builds each target by name. Tests add their own.
var targets = map[string]func(options) loadgen.Target{
	"shardstock": func(o options) loadgen.Target {
		return shardstock.New(shardstock.Config{Addr: o.addr, AdminToken: o.adminToken})
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
}

// groups name several targets at once, in the order they run.
var groups = map[string][]string{
	"all-baselines": {"naive", "onerow", "subrows", "redis", "redis-fsync"},
	"all":           {"naive", "onerow", "subrows", "redis", "redis-fsync", "shardstock"},
}

// parseTargets expands a comma-separated list of targets and groups.
func parseTargets(s string) ([]string, error) {
	var names []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		members, ok := groups[n]
		if !ok {
			if _, ok := targets[n]; !ok {
				return nil, fmt.Errorf("unknown target %q (want shardstock, naive, onerow, subrows, redis, redis-fsync, all-baselines or all)", n)
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

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		targetList  = fs.String("target", "all-baselines", "comma-separated targets: shardstock, naive, onerow, subrows, redis, redis-fsync; or all-baselines, all")
		addr        = fs.String("addr", shardstock.AddrDefault, "shardstock allocator base URL (cleartext HTTP/2)")
		adminToken  = fs.String("admin-token", getenv("SHARDSTOCK_ADMIN_TOKEN"), "shardstock admin bearer token (default $SHARDSTOCK_ADMIN_TOKEN)")
		databaseURL = fs.String("database-url", getenv("DATABASE_URL"), "Postgres URL of the baselines (default $DATABASE_URL)")
		redisAddr   = fs.String("redis-addr", "127.0.0.1:6379", "Redis address of the Redis baselines")
		model       = fs.String("model", "A", "traffic model: A (uniform), B (20% of SKUs get 80%), C (one 100-unit SKU gets 70%), case (100 units, 500 deducts, 50 reused keys)")
		duration    = fs.Duration("duration", 10*time.Second, "load time per target (at most 1h); the run stops at -duration or -requests, whichever comes first")
		requests    = fs.Int64("requests", 0, "client operations per target (0: until -duration; at most 10,000,000)")
		concurrency = fs.Int("concurrency", 64, "concurrent clients")
		shards      = fs.Int("shards", 8, "shards per SKU (shardstock) and rows per SKU (subrows)")
		stockPerSKU = fs.Int64("stock", 1_000_000, "stock per SKU (the hot SKU of model C and the case have 100)")
		skus        = fs.Int("skus", 1000, "number of SKUs (models A, B, C)")
		qty         = fs.String("qty", "1", "quantity per request: N, or 1..K for uniform")
		mix         = fs.String("mix", "deduct=100", "flows: deduct=N,commit=N,release=N (reserve then commit, reserve then release)")
		dupRate     = fs.Float64("dup-rate", 0, "share of requests sent twice at once with the same key")
		abandonRate = fs.Float64("abandon-rate", 0, "share of requests abandoned right after sending, then retried with the same key until a definite answer")
		timeout     = fs.Duration("request-timeout", 10*time.Second, "deadline of each request")
		seed        = fs.Uint64("seed", 1, "seed of every random choice")
		pgConns     = fs.Int("pg-conns", 50, "connection pool size of each Postgres baseline")
		redisPool   = fs.Int("redis-pool", 128, "connection pool size of each Redis baseline")
		reportPath  = fs.String("report", "", "write an HTML report to this path")
		progress    = fs.Bool("progress", true, "show a progress bar on stderr")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	names, err := parseTargets(*targetList)
	if err != nil {
		return err
	}
	m, err := loadgen.ParseModel(*model)
	if err != nil {
		return err
	}
	q, err := loadgen.ParseQty(*qty)
	if err != nil {
		return err
	}
	mx, err := loadgen.ParseMix(*mix)
	if err != nil {
		return err
	}
	if *shards < 1 || *shards > 256 || *pgConns < 1 || *pgConns > 1000 || *redisPool < 1 || *redisPool > 10_000 {
		return fmt.Errorf("-shards (1 to 256), -pg-conns (1 to 1000) or -redis-pool (1 to 10000) out of range")
	}
	// The runner reads zero as "default": refuse it here.
	if *duration <= 0 || *concurrency < 1 || *skus < 1 || *stockPerSKU < 1 || *requests < 0 || *timeout <= 0 {
		return fmt.Errorf("-duration, -concurrency, -skus, -stock and -request-timeout must be positive, -requests not negative")
	}
	cfg := loadgen.Config{
		Model: m, SKUs: *skus, Stock: *stockPerSKU, Shards: int32(*shards),
		Duration: *duration, Requests: *requests, Concurrency: *concurrency,
		Qty: q, Mix: mx, DupRate: *dupRate, AbandonRate: *abandonRate,
		RequestTimeout: *timeout, Seed: *seed,
	}
	if *progress {
		cfg.Progress = stderr
	}
	runner, err := loadgen.NewRunner(cfg)
	if err != nil {
		return err
	}
	opts := options{
		addr: *addr, adminToken: *adminToken, databaseURL: *databaseURL, redisAddr: *redisAddr,
		pgConns: int32(*pgConns), redisPool: *redisPool,
	}

	var results []*loadgen.Result
	var errs []error
	for _, name := range names {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("%s: not run: %w", name, ctx.Err()))
			continue
		}
		fmt.Fprintf(stderr, "loadgen: %s: model %s, %d clients\n", name, m, *concurrency)
		t := targets[name](opts)
		res, err := runner.Run(ctx, t)
		if cerr := t.Close(); cerr != nil {
			errs = append(errs, fmt.Errorf("%s: close: %w", name, cerr))
		}
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: %s: %v\n", name, err)
			errs = append(errs, err)
			continue
		}
		results = append(results, res)
	}

	if len(results) > 0 {
		if err := loadgen.WriteTable(stdout, results); err != nil {
			return err
		}
	}
	if *reportPath != "" && len(results) > 0 {
		if err := writeReport(*reportPath, results); err != nil {
			errs = append(errs, err)
		} else {
			fmt.Fprintf(stderr, "loadgen: report written to %s\n", *reportPath)
		}
	}
	for _, r := range results {
		if r.Failed() {
			c := r.Correctness
			errs = append(errs, fmt.Errorf("%s: correctness not zero: oversold %d, undersold %d, duplicates %d, reconciliation differences %d",
				r.Target, c.Oversold, c.Undersold, c.Duplicates, c.Reconciliation))
		}
	}
	return errors.Join(errs...)
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
