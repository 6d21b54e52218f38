package loadgen_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/loadgentest"
	"github.com/shardstock/shardstock/internal/stock"
)

// run drives target with cfg, bounded by count and by time.
func run(t *testing.T, target loadgen.Target, cfg loadgen.Config) *loadgen.Result {
	t.Helper()
	if cfg.Duration == 0 {
		cfg.Duration = 5 * time.Second
	}
	r, err := loadgen.NewRunner(cfg)
	if err != nil {
		t.Fatalf("NewRunner(%+v) = %v", cfg, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := r.Run(ctx, target)
	if err != nil {
		t.Fatalf("Run(%s) = %v", target.Name(), err)
	}
	if err := target.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	return res
}

// checkCounts checks the invariants of the counts every run must keep.
func checkCounts(t *testing.T, res *loadgen.Result) {
	t.Helper()
	if got := res.OK + res.Replayed + res.OutOfStock + res.Errors; got != res.Requests {
		t.Errorf("ok %d + replayed %d + oos %d + errors %d = %d, want requests %d", res.OK, res.Replayed, res.OutOfStock, res.Errors, got, res.Requests)
	}
	var codes, secs int64
	for _, n := range res.ErrorsByCode {
		codes += n
	}
	if codes != res.Errors {
		t.Errorf("errors by code sum to %d, want %d", codes, res.Errors)
	}
	for _, s := range res.Seconds {
		secs += s.Requests
	}
	if secs != res.Requests {
		t.Errorf("per-second requests sum to %d, want %d", secs, res.Requests)
	}
	abandoned := res.ErrorsByCode[loadgen.CodeAbandoned]
	if got := res.Latency.TotalCount(); got != res.Requests-abandoned {
		t.Errorf("latency histogram holds %d, want %d (requests %d - abandoned %d)", got, res.Requests-abandoned, res.Requests, abandoned)
	}
	if got := res.OutOfStockLatency.TotalCount(); got != res.OutOfStock {
		t.Errorf("out-of-stock histogram holds %d, want %d", got, res.OutOfStock)
	}
}

func TestRunner_Case(t *testing.T) {
	t.Run("Exact", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 32})
		checkCounts(t, res)
		if res.Requests != 500 || res.Flows != 500 {
			t.Errorf("requests %d, flows %d, want 500, 500", res.Requests, res.Flows)
		}
		if res.OK != 100 {
			t.Errorf("ok = %d, want 100", res.OK)
		}
		if res.Replayed == 0 || res.Replayed > loadgen.CaseReusedKeys {
			t.Errorf("replayed = %d, want 1 to %d", res.Replayed, loadgen.CaseReusedKeys)
		}
		if !res.Correctness.Clean() || res.Failed() {
			t.Errorf("correctness = %+v, want clean", res.Correctness)
		}
		st := res.State.SKUs[res.SKUs[0].SKU]
		if st.Available != 0 || st.Sold != 100 || st.Ledger["deduct"] != 100 || st.DistinctKeys != 100 {
			t.Errorf("state = %+v, want available 0, sold 100, 100 deduct entries for 100 keys", st)
		}
	})
	t.Run("Oversell", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{Oversell: 5}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8})
		c := res.Correctness
		if res.OK != 105 || c.Oversold != 5 || !res.Failed() {
			t.Errorf("ok %d, correctness %+v, failed %v; want ok 105, oversold 5, failed", res.OK, c, res.Failed())
		}
	})
	t.Run("FalseSoldOut", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{Hoard: 10}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8})
		c := res.Correctness
		if res.OK != 90 || c.Undersold != 10 || c.FalseSoldOut == 0 || c.FalseSoldOut > res.OutOfStock {
			t.Errorf("ok %d, oos %d, correctness %+v; want ok 90, undersold 10, 1 to %d false sold-outs", res.OK, res.OutOfStock, c, res.OutOfStock)
		}
	})
	t.Run("DropLedger", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{DropLedger: true}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8})
		if c := res.Correctness; c.Reconciliation == 0 || c.Oversold != 0 {
			t.Errorf("correctness %+v, want reconciliation differences and no oversell", c)
		}
	})
}

func TestRunner_Faults(t *testing.T) {
	base := loadgen.Config{Model: loadgen.ModelA, SKUs: 50, Stock: 1_000_000, Requests: 2000, Concurrency: 16}
	t.Run("Duplicates", func(t *testing.T) {
		cfg := base
		cfg.DupRate = 1
		res := run(t, &loadgentest.Memory{}, cfg)
		checkCounts(t, res)
		if res.Requests != 2*res.Flows || res.Flows != 2000 {
			t.Errorf("requests %d, flows %d, want 4000, 2000", res.Requests, res.Flows)
		}
		if res.OK != 2000 || res.Replayed != 2000 {
			t.Errorf("ok %d, replayed %d, want 2000 each", res.OK, res.Replayed)
		}
		if !res.Correctness.Clean() {
			t.Errorf("correctness = %+v, want clean", res.Correctness)
		}
	})
	t.Run("DuplicatesApplied", func(t *testing.T) {
		cfg := base
		cfg.DupRate = 1
		res := run(t, &loadgentest.Memory{IgnoreKeys: true}, cfg)
		if c := res.Correctness; c.Duplicates != 2000 || !res.Failed() {
			t.Errorf("correctness = %+v, want 2000 duplicates", c)
		}
	})
	t.Run("Abandon", func(t *testing.T) {
		cfg := base
		cfg.AbandonRate = 1
		res := run(t, &loadgentest.Memory{}, cfg)
		checkCounts(t, res)
		if got := res.ErrorsByCode[loadgen.CodeAbandoned]; got != 2000 {
			t.Errorf("abandoned = %d, want 2000 (errors %v)", got, res.ErrorsByCode)
		}
		if res.OK+res.Replayed != 2000 {
			t.Errorf("ok %d + replayed %d, want 2000: every abandoned request retried to an answer", res.OK, res.Replayed)
		}
		if c := res.Correctness; !c.Clean() || c.Unresolved != 0 {
			t.Errorf("correctness = %+v, want clean and resolved", c)
		}
	})
	t.Run("Mix", func(t *testing.T) {
		cfg := base
		cfg.Mix = loadgen.Mix{Deduct: 1, Commit: 1, Release: 1}
		cfg.Qty = loadgen.QtyDist{Min: 1, Max: 5}
		cfg.DupRate, cfg.AbandonRate = 0.1, 0.1
		res := run(t, &loadgentest.Memory{}, cfg)
		checkCounts(t, res)
		for _, op := range []string{"deduct", "reserve", "commit", "release"} {
			if res.RequestsByOp[op] == 0 {
				t.Errorf("requests by op %v: no %s", res.RequestsByOp, op)
			}
		}
		if c := res.Correctness; !c.Clean() {
			t.Errorf("correctness = %+v, want clean", c)
		}
	})
	t.Run("LostAcknowledged", func(t *testing.T) {
		// Every 50th deduct, reserve or commit is answered as a success and
		// not applied.
		cfg := base
		cfg.Mix = loadgen.Mix{Deduct: 1, Commit: 1, Release: 1}
		res := run(t, &loadgentest.Memory{LoseEvery: 50}, cfg)
		if c := res.Correctness; c.Lost == 0 || !res.Failed() {
			t.Errorf("correctness = %+v, want lost acknowledged operations", c)
		}
	})
	t.Run("ReleasesAfterSellOut", func(t *testing.T) {
		// The hot SKU sells out while releases keep returning stock: refusals
		// then are true sold-outs, not undersold.
		cfg := loadgen.Config{Model: loadgen.ModelC, SKUs: 10, Stock: 1000, Requests: 5000, Concurrency: 16,
			Mix: loadgen.Mix{Deduct: 1, Release: 2}, Qty: loadgen.QtyDist{Min: 1, Max: 3}}
		res := run(t, &loadgentest.Memory{}, cfg)
		checkCounts(t, res)
		if res.OutOfStock == 0 {
			t.Errorf("no out-of-stock answer: the hot SKU never sold out")
		}
		if c := res.Correctness; !c.Clean() {
			t.Errorf("correctness = %+v, want clean", c)
		}
	})
}

func TestRunner_Bounded(t *testing.T) {
	t.Run("ByTime", func(t *testing.T) {
		start := time.Now()
		res := run(t, &loadgentest.Memory{Latency: time.Millisecond}, loadgen.Config{Model: loadgen.ModelB, SKUs: 20, Concurrency: 4, Duration: 300 * time.Millisecond})
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("run took %s, want about 300ms", d)
		}
		if res.Flows == 0 || res.Throughput() == 0 {
			t.Errorf("flows %d, throughput %g: want some", res.Flows, res.Throughput())
		}
	})
	t.Run("ByCount", func(t *testing.T) {
		res := run(t, &loadgentest.Memory{}, loadgen.Config{Model: loadgen.ModelA, SKUs: 5, Concurrency: 7, Requests: 123})
		if res.Flows != 123 || res.Requests != 123 {
			t.Errorf("flows %d, requests %d, want 123", res.Flows, res.Requests)
		}
	})
	t.Run("Paced", func(t *testing.T) {
		// 200 operations a second over 16 clients for a second: about 200,
		// whatever the clients could do unpaced.
		res := run(t, &loadgentest.Memory{}, loadgen.Config{Model: loadgen.ModelA, SKUs: 5, Concurrency: 16, Duration: time.Second, Rate: 200})
		if res.Flows < 150 || res.Flows > 230 {
			t.Errorf("flows %d in %s at rate 200/s, want about 200", res.Flows, res.Elapsed)
		}
	})
	t.Run("Retry", func(t *testing.T) {
		cfg := loadgen.Config{Model: loadgen.ModelA, SKUs: 5, Stock: 1000, Concurrency: 8, Requests: 200, Retry: true}
		res := run(t, &loadgentest.Memory{Flaky: true}, cfg)
		if res.OK != 200 || res.ErrorsByCode[string(stock.CodeShardUnavailable)] != 200 || res.Correctness.Unresolved != 0 {
			t.Errorf("ok %d, errors %v, unresolved %d: want 200 ok after 200 retried SHARD_UNAVAILABLE, none unresolved",
				res.OK, res.ErrorsByCode, res.Correctness.Unresolved)
		}
		cfg.Retry = false
		res = run(t, &loadgentest.Memory{Flaky: true}, cfg)
		if res.OK != 0 || res.Correctness.Unresolved != 200 || !res.Correctness.Clean() {
			t.Errorf("without retry: ok %d, unresolved %d, correctness %+v: want none ok, 200 unresolved, clean",
				res.OK, res.Correctness.Unresolved, res.Correctness)
		}
	})
	t.Run("BadRate", func(t *testing.T) {
		if _, err := loadgen.NewRunner(loadgen.Config{Rate: -1}); err == nil {
			t.Errorf("NewRunner(rate -1) = nil, want an error")
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		r, err := loadgen.NewRunner(loadgen.Config{Model: loadgen.ModelA, SKUs: 5, Concurrency: 2, Duration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		res, err := r.Run(ctx, &loadgentest.Memory{Latency: time.Millisecond})
		if err != nil {
			t.Fatalf("Run() = %v", err)
		}
		if res.Elapsed > 5*time.Second || !res.Correctness.Clean() {
			t.Errorf("elapsed %s, correctness %+v: want a short clean run", res.Elapsed, res.Correctness)
		}
	})
}

func TestWriteTable(t *testing.T) {
	cfg := loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8, RunID: "t1"}
	good := run(t, &loadgentest.Memory{}, cfg)
	bad := run(t, &loadgentest.Memory{Oversell: 3}, cfg)
	bad.Target = "onerow" // as the ratio base
	var b bytes.Buffer
	if err := loadgen.WriteTable(&b, []*loadgen.Result{good, bad}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	header := strings.Fields(strings.Split(out, "\n")[1])
	if strings.Join(header, " ") != strings.Join(loadgen.Columns, " ") {
		t.Errorf("header = %q, want %q", header, loadgen.Columns)
	}
	for _, want := range []string{"memory", "onerow", "FAIL", "oversold 3", "errors by code:", "throughput against onerow"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	row := strings.Fields(strings.Split(out, "\n")[2])
	if len(row) != len(loadgen.Columns) {
		t.Errorf("row %q has %d cells, want %d", row, len(row), len(loadgen.Columns))
	}
}

// The CPU block: each measured run's server and client CPU per answered
// request, and why the server side was not measured when it was not.
func TestWriteTable_CPU(t *testing.T) {
	cfg := loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8, RunID: "t2"}
	a := run(t, &loadgentest.Memory{}, cfg) // 500 requests
	a.CPU = &loadgen.CPU{Procs: "the in-memory server", Server: 50 * time.Millisecond, Client: 25 * time.Millisecond}
	a.Target = loadgen.CeilingTarget
	b := run(t, &loadgentest.Memory{}, cfg)
	b.Target = "other"
	b.CPU = &loadgen.CPU{Client: 10 * time.Millisecond, Err: errors.New("no server processes")}
	// shardstock: 2.5 times the ceiling's server CPU per request, at half
	// its throughput.
	c := run(t, &loadgentest.Memory{}, cfg)
	c.Target = "shardstock"
	c.Requests, c.Elapsed = a.Requests, 2*a.Elapsed
	c.CPU = &loadgen.CPU{Procs: "allocator", Server: 125 * time.Millisecond, Client: 25 * time.Millisecond,
		Parts: []loadgen.CPUPart{{Name: "Go", Time: 75 * time.Millisecond}, {Name: "Postgres", Time: 50 * time.Millisecond}}}
	// Paced: no ratio (latency below the peak, not cost at it).
	d := run(t, &loadgentest.Memory{}, cfg)
	d.Target = "paced"
	d.Config.Rate = 100
	d.CPU = &loadgen.CPU{Procs: "allocator", Server: 125 * time.Millisecond, Client: 25 * time.Millisecond}
	// A baseline: its server side is only a database, not an API server.
	e := run(t, &loadgentest.Memory{}, cfg)
	e.Target, e.Baseline = "onerow", true
	e.CPU = &loadgen.CPU{Procs: "Postgres", Server: 125 * time.Millisecond, Client: 25 * time.Millisecond}
	// The Connect-fronted Redis: shardstock takes 1.25 times its server
	// CPU per request, at the same throughput.
	f := run(t, &loadgentest.Memory{}, cfg)
	f.Target, f.Baseline = loadgen.FrontedRedisTarget, true
	f.Requests, f.Elapsed = c.Requests, c.Elapsed
	f.CPU = &loadgen.CPU{Procs: "the API server", Server: 100 * time.Millisecond}
	var buf bytes.Buffer
	if err := loadgen.WriteTable(&buf, []*loadgen.Result{a, b, c, d, e, f}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cpu per answered request", "server 100µs, client 50µs (the in-memory server)\n",
		"other: server not measured (no server processes); client 20µs",
		"shardstock: server 250µs = Go 150µs + Postgres 100µs, client 50µs (allocator): 2.50x the ceiling's server CPU per request, 0.50x its req/s\n",
		"paced: server 250µs, client 50µs (allocator)\n", "onerow: server 250µs, client 50µs (Postgres)\n",
		"shardstock against the Connect-fronted Redis (redis-api): 1.25x its server CPU per request, 1.00x its req/s\n"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestWriteReport(t *testing.T) {
	res := run(t, &loadgentest.Memory{}, loadgen.Config{Model: loadgen.ModelC, SKUs: 10, Requests: 2000, Concurrency: 8})
	other := run(t, &loadgentest.Memory{Oversell: 1}, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 8})
	var b bytes.Buffer
	if err := loadgen.WriteReport(&b, []*loadgen.Result{res, other}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"<svg", "<rect", "Latency", "Answers per second", "Throughput by target", "FAIL"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// A run taken in windows (Session) goes on where its last window stopped:
// the same keys never sent twice, every window between the hooks, and the
// whole count done as in one Run; two sessions take turns.
func TestRunner_Session(t *testing.T) {
	const windows, requests = 4, 2000
	var started, ended [2]int
	var sessions [2]*loadgen.Session
	var targets [2]*loadgentest.Memory
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range sessions {
		cfg := loadgen.Config{Model: loadgen.ModelC, SKUs: 10, Requests: requests, Concurrency: 8, Duration: time.Minute,
			LoadStarted: func() { started[i]++ }, LoadEnded: func() { ended[i]++ }}
		r, err := loadgen.NewRunner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		targets[i] = &loadgentest.Memory{Latency: 200 * time.Microsecond}
		if sessions[i], err = r.Start(ctx, targets[i]); err != nil {
			t.Fatalf("Start() = %v", err)
		}
	}
	// 8 clients at 200 µs a request: about 40,000 a second, so the
	// windows of 10 ms end long before the count, and the last one, of
	// a minute, runs it out.
	for w := range windows {
		d := 10 * time.Millisecond
		if w == windows-1 {
			d = time.Minute
		}
		for i, s := range sessions {
			if more := s.Load(ctx, d); more == (w == windows-1) {
				t.Errorf("session %d window %d: Load() = %v", i, w, more)
			}
		}
	}
	for i, s := range sessions {
		res, err := s.Finish(ctx)
		if err != nil {
			t.Fatalf("Finish() = %v", err)
		}
		if err := targets[i].Close(); err != nil {
			t.Fatal(err)
		}
		checkCounts(t, res)
		if res.Flows != requests || res.Replayed != 0 || !res.Correctness.Clean() {
			t.Errorf("session %d: flows %d, replayed %d, correctness %+v: want %d, none, clean", i, res.Flows, res.Replayed, res.Correctness, requests)
		}
		if started[i] != windows || ended[i] != windows {
			t.Errorf("session %d: LoadStarted %d times, LoadEnded %d, want %d each", i, started[i], ended[i], windows)
		}
		if res.Elapsed < 3*10*time.Millisecond || res.Elapsed > 20*time.Second {
			t.Errorf("session %d: elapsed %s, want the windows' sum", i, res.Elapsed)
		}
	}
}

// A run in windows is the run in one stretch, cut: with one client its
// random sequence goes on from window to window (the same SKUs sold as in
// one Run), Elapsed sums the windows and not the pauses between them,
// and the per-second answers run on from window to window.
func TestRunner_SessionSameRun(t *testing.T) {
	const requests = 400
	cfg := loadgen.Config{Model: loadgen.ModelC, SKUs: 10, Requests: requests, Concurrency: 1, Duration: time.Minute, RunID: "same"}
	whole := run(t, &loadgentest.Memory{}, cfg)

	r, err := loadgen.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	target := &loadgentest.Memory{Latency: time.Millisecond}
	s, err := r.Start(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	const window, pause = 100 * time.Millisecond, 1100 * time.Millisecond
	for range 3 {
		if !s.Load(ctx, window) {
			t.Fatalf("the count ran out within a window of %s", window)
		}
		time.Sleep(pause)
	}
	s.Load(ctx, time.Minute)
	res, err := s.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = target.Close()
	for sku, w := range whole.State.SKUs {
		if got := res.State.SKUs[sku]; got.Sold != w.Sold || got.Available != w.Available {
			t.Errorf("%s: sold %d, available %d in windows; %d, %d in one run", sku, got.Sold, got.Available, w.Sold, w.Available)
		}
	}
	if res.Elapsed < 3*window || res.Elapsed > 3*pause {
		t.Errorf("elapsed %s, want the windows' sum, not the pauses (3 windows of %s, then the rest)", res.Elapsed, window)
	}
	if n := len(res.Seconds); n > int(res.Elapsed/time.Second)+2 {
		t.Errorf("%d per-second entries for %s of load: the pauses counted", n, res.Elapsed)
	}
}
