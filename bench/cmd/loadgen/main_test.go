package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/loadgentest"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	shardstockv1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/pgtest"
)

// brokenBaseline oversells like a broken system, but is a baseline.
type brokenBaseline struct{ *loadgentest.Memory }

func (brokenBaseline) Name() string   { return "broken-baseline" }
func (brokenBaseline) Baseline() bool { return true }

// broken oversells 5 units and is not a baseline.
type broken struct{ *loadgentest.Memory }

func (broken) Name() string { return "broken" }

func init() {
	targets["fake"] = func(options) loadgen.Target { return &loadgentest.Memory{} }
	targets["broken"] = func(options) loadgen.Target { return broken{&loadgentest.Memory{Oversell: 5}} }
	targets["broken-baseline"] = func(options) loadgen.Target { return brokenBaseline{&loadgentest.Memory{Oversell: 5}} }
}

// TestMain runs main itself when asked to, so that a test can check the
// process's exit status, and serves the memory target when the memory
// target starts this binary as its server.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == serveMemoryArg {
		main()
		os.Exit(0)
	}
	if args := os.Getenv("LOADGEN_TEST_MAIN"); args != "" {
		os.Args = append([]string{"loadgen"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	pgtest.Main(m)
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func runArgs(t *testing.T, getenv func(string) string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, append([]string{"-progress=false", "-duration", "10s"}, args...), getenv, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestRun_Table(t *testing.T) {
	report := filepath.Join(t.TempDir(), "report.html")
	out, _, err := runArgs(t, env(nil), "-target", "fake,broken-baseline", "-model", "case", "-concurrency", "16", "-report", report)
	if err != nil {
		t.Fatalf("run() = %v, want nil (a broken baseline is reported, not failed)\n%s", err, out)
	}
	header := strings.Fields(strings.Split(out, "\n")[1])
	if strings.Join(header, " ") != strings.Join(loadgen.Columns, " ") {
		t.Errorf("table header = %q, want %q\n%s", header, loadgen.Columns, out)
	}
	for _, want := range []string{"fake", "broken-baseline", "reported", "oversold 5", "errors by code:", "correctness:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	html, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if !bytes.Contains(html, []byte("<svg")) || !bytes.Contains(html, []byte("broken-baseline")) {
		t.Errorf("report lacks charts or targets")
	}
}

// TestRun_DiskProbe probes a directory during the run and reports the disk
// beside the table.
func TestRun_DiskProbe(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runArgs(t, env(nil), "-target", "fake", "-model", "case", "-disk-probe", dir)
	if err != nil {
		t.Fatalf("run() = %v\n%s", err, out)
	}
	for _, want := range []string{"disk (a write of 8 KiB and an fdatasync every few ms in " + dir, "  fake: ", " syncs, p50 ", "answers over 25ms: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("the probe left %q behind", left)
	}
}

func TestRun_ExitStatus(t *testing.T) {
	t.Run("Run", func(t *testing.T) {
		out, _, err := runArgs(t, env(nil), "-target", "broken", "-model", "case")
		if err == nil || !strings.Contains(err.Error(), "oversold 5") {
			t.Errorf("run(broken) = %v, want an oversold error\n%s", err, out)
		}
		if !strings.Contains(out, "FAIL") {
			t.Errorf("table does not say FAIL:\n%s", out)
		}
	})
	for _, tc := range []struct {
		target string
		code   int
	}{{"fake", 0}, {"broken", 1}, {"broken-baseline", 0}} {
		t.Run("Process/"+tc.target, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "LOADGEN_TEST_MAIN=-progress=false -model case -target "+tc.target)
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Errorf("loadgen -target %s exited %d, want %d\n%s", tc.target, code, tc.code, out)
			}
		})
	}
}

func TestRun_Flags(t *testing.T) {
	for _, args := range [][]string{
		{"-target", "nope"},
		{"-model", "D"},
		{"-qty", "0"},
		{"-mix", "buy=1"},
		{"-concurrency", "0"},
		{"-dup-rate", "2"},
		{"-shards", "0"},
		{"-shards", "1,x"},
		{"-rate", "-1"},
		{"-paced", "2"},
		{"-model", "C,D"},
		{"-server-profile", "prof"}, // needs -stack
		{"-stack-args", "-shard-servers 0"},
		{"-disk-probe", ".", "-latency-goal", "0"},
		{"-disk-probe", "/nonexistent-shardstock-dir"},
		{"-latency-goal", "-1ms"},
		{"extra"},
	} {
		if _, _, err := runArgs(t, env(nil), append([]string{"-target", "fake"}, args...)...); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
	if _, _, err := runArgs(t, env(nil), "-h"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run(-h) = %v, want flag.ErrHelp", err)
	}
}

// TestRun_Lists runs two models and two shard counts: a table per model,
// a row per target and count, and a paced rerun.
func TestRun_Lists(t *testing.T) {
	out, _, err := runArgs(t, env(nil), "-target", "fake", "-model", "case,A", "-shards", "1,2", "-requests", "300",
		"-skus", "10", "-paced", "0.5", "-paced-targets", "fake")
	if err != nil {
		t.Fatalf("run() = %v\n%s", err, out)
	}
	for _, want := range []string{"model case,", "model A,", "shards 1,2,", " fake/1 ", " fake/2 ", " fake/1@50% ", "paced: fake/2@50% started at most "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Two paced runs, each in a row, an errors line, a paced line, a CPU
	// line and a correctness line; none of the case.
	if n := strings.Count(out, "@50%"); n != 10 {
		t.Errorf("%d mentions of a paced run, want 10:\n%s", n, out)
	}
}

// TestRun_Baselines runs two real baselines side by side and prints the
// ratio against baseline (2).
func TestRun_Baselines(t *testing.T) {
	getenv := env(map[string]string{"DATABASE_URL": pgtest.NewDB(t)})
	out, _, err := runArgs(t, getenv, "-target", "onerow,redis", "-model", "case", "-concurrency", "32")
	if err != nil {
		t.Fatalf("run() = %v\n%s", err, out)
	}
	for _, want := range []string{"onerow", "redis", "throughput against onerow (baseline 2): redis ", "all zero"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestRun_Stack builds the dev stack, lets loadgen start it on a database
// of its own and runs the source document's case, then 100 carts (model
// cart: orders, commits, refunds), against it, with faults: the shardstock
// target against the real API, end to end. The stack runs
// one shard server of its own and one in the allocator's process
// (-stack-args), so both the RPC and the in-process paths serve.
func TestRun_Stack(t *testing.T) {
	bin := buildStack(t)
	getenv := env(map[string]string{"DATABASE_URL": pgtest.NewDB(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-progress=false", "-stack", bin, "-stack-log", filepath.Join(t.TempDir(), "stack.log"),
		"-stack-args", "-shard-servers 1 -allocator-shard",
		"-target", "shardstock", "-model", "case,cart", "-requests", "100", "-skus", "20",
		"-shards", "4", "-dup-rate", "0.2", "-abandon-rate", "0.2"}, getenv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run(-stack) = %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	for _, want := range []string{"shardstock", "stack flags -shard-servers 1 -allocator-shard",
		"  shardstock: oversold 0, undersold 0 (0 false sold-outs), duplicates 0, lost acknowledged 0, reconciliation differences 0, unresolved 0: all zero",
		// Abandoned or duplicated ReserveOrders may leave a cart unresolved
		// (its fate unknown to the client): the check still holds.
		"cart: shardstock: 100 orders sent",
		"  shardstock: oversold 0, undersold 0 (0 false sold-outs), duplicates 0, lost acknowledged 0, reconciliation differences 0, orders half held 0, refunded beyond their sale 0, unresolved ",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &stdout)
		}
	}
}

// buildStack builds cmd/shardstock-dev into the test's directory and
// returns its path; it skips the test under -short.
func buildStack(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and starts the dev stack")
	}
	bin := filepath.Join(t.TempDir(), "shardstock-dev")
	// In the product's own module (the root of the tree), with its
	// go.mod, as make run builds it.
	build := exec.Command("go", "build", "-o", bin, "./cmd/shardstock-dev")
	build.Dir = "../../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestStack_Verify checks the shardstock target's Verify against the real
// API: replenishments and adjustments count as stock added, reservations
// held, committed and released are where the ledger says, and nothing is
// reported.
func TestStack_Verify(t *testing.T) {
	bin := buildStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	st, err := startStack(ctx, stackConfig{Bin: bin, ServerURL: pgtest.NewDB(t), BaselineConns: 1,
		LogPath: filepath.Join(t.TempDir(), "stack.log"), Stderr: &stderr})
	if err != nil {
		t.Fatalf("startStack() = %v\n%s", err, &stderr)
	}
	defer func() {
		if err := st.stop(); err != nil {
			t.Errorf("stop() = %v", err)
		}
	}()
	// The stack's readiness line named its three shard servers (the
	// default), where each serves its /metrics (and its profiles).
	for _, id := range []string{"shard-1", "shard-2", "shard-3"} {
		resp, err := http.Get(st.shardURLs[id] + "/metrics")
		if err != nil {
			t.Errorf("shard server %s at %q (of %v): %v", id, st.shardURLs[id], st.shardURLs, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s/metrics = %s, want 200", st.shardURLs[id], resp.Status)
		}
	}

	target := shardstock.New(shardstock.Config{Addr: st.baseURL, AdminToken: st.token})
	defer target.Close()
	skus := []loadgen.SKUSpec{{SKU: "verify-" + randomHex(4), Stock: 20, Shards: 4}}
	sku := skus[0].SKU
	if err := target.Setup(ctx, skus); err != nil {
		t.Fatal(err)
	}
	want := func(what string, o loadgen.Outcome) {
		t.Helper()
		if o.Status != loadgen.StatusOK {
			t.Fatalf("%s = %v, want ok", what, o)
		}
	}
	want("Deduct(3)", target.Deduct(ctx, sku, "d1", 3))
	id1, o := target.Reserve(ctx, sku, "r1", 2)
	want("Reserve(2)", o)
	want("Commit", target.Commit(ctx, id1))
	id2, o := target.Reserve(ctx, sku, "r2", 4)
	want("Reserve(4)", o)
	want("Release", target.Release(ctx, id2))
	_, o = target.Reserve(ctx, sku, "r3", 1) // held
	want("Reserve(1)", o)

	inv := shardstockv1connect.NewInventoryServiceClient(http.DefaultClient, st.baseURL)
	rep := connect.NewRequest(&shardstockv1.ReplenishRequest{Sku: sku, Quantity: 5, IdempotencyKey: "p1", Reason: "refund"})
	rep.Header().Set("Authorization", "Bearer "+st.token) // an admin acts as a service
	if _, err := inv.Replenish(ctx, rep); err != nil {
		t.Fatalf("Replenish(5) = %v", err)
	}
	admin := shardstockv1connect.NewAdminServiceClient(http.DefaultClient, st.baseURL)
	adj := connect.NewRequest(&shardstockv1.AdjustStockRequest{Sku: sku, Delta: -2, Reason: "count", Approver: "test", IdempotencyKey: "a1"})
	adj.Header().Set("Authorization", "Bearer "+st.token)
	if _, err := admin.AdjustStock(ctx, adj); err != nil {
		t.Fatalf("AdjustStock(-2) = %v", err)
	}

	state, err := target.Verify(ctx, skus)
	if err != nil {
		t.Fatalf("Verify() = %v", err)
	}
	s := state.SKUs[sku]
	// 20 + 5 - 2 = 23: sold 3 + 2, reserved 1, available 17.
	if s.Replenished != 3 || s.Sold != 5 || s.Reserved != 1 || s.Available != 17 || s.InTransit != 0 {
		t.Errorf("Verify() = %+v, want replenished 3, sold 5, reserved 1, available 17, none in transit", s)
	}
	if s.Operations != 4 || s.DistinctKeys != 4 || s.ExtraEnds != 0 || len(s.Discrepancies) != 0 {
		t.Errorf("Verify() = %d operations of %d keys, %d extra ends, discrepancies %+v; want 4 of 4, 0, none",
			s.Operations, s.DistinctKeys, s.ExtraEnds, s.Discrepancies)
	}
	for kind, n := range map[string]int64{"deduct": 1, "reserve": 3, "commit": 1, "release": 1, "replenish": 1, "adjust": 1} {
		if s.Ledger[kind] != n {
			t.Errorf("Verify() ledger %v: %s = %d, want %d", s.Ledger, kind, s.Ledger[kind], n)
		}
	}
}
