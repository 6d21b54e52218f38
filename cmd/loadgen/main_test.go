package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/loadgen"
	"github.com/shardstock/shardstock/internal/loadgen/loadgentest"
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
	targets["memory"] = func(options) loadgen.Target { return &loadgentest.Memory{} }
	targets["broken"] = func(options) loadgen.Target { return broken{&loadgentest.Memory{Oversell: 5}} }
	targets["broken-baseline"] = func(options) loadgen.Target { return brokenBaseline{&loadgentest.Memory{Oversell: 5}} }
}

// TestMain runs main itself when asked to, so that a test can check the
// process's exit status.
func TestMain(m *testing.M) {
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
	out, _, err := runArgs(t, env(nil), "-target", "memory,broken-baseline", "-model", "case", "-concurrency", "16", "-report", report)
	if err != nil {
		t.Fatalf("run() = %v, want nil (a broken baseline is reported, not failed)\n%s", err, out)
	}
	header := strings.Fields(strings.Split(out, "\n")[1])
	if strings.Join(header, " ") != strings.Join(loadgen.Columns, " ") {
		t.Errorf("table header = %q, want %q\n%s", header, loadgen.Columns, out)
	}
	for _, want := range []string{"memory", "broken-baseline", "reported", "oversold 5", "errors by code:", "correctness:"} {
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
	}{{"memory", 0}, {"broken", 1}, {"broken-baseline", 0}} {
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
		{"extra"},
	} {
		if _, _, err := runArgs(t, env(nil), append([]string{"-target", "memory"}, args...)...); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
	if _, _, err := runArgs(t, env(nil), "-h"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run(-h) = %v, want flag.ErrHelp", err)
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
