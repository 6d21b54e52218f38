package shardcmd_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/cmd/shardcmd"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
)

// Bounds of the start and stop of a command in a test.
const (
	startTimeout = 30 * time.Second
	// stopTimeout is rpc's shutdownTimeout (10 s) with room to spare; a
	// server with nothing in flight stops far sooner.
	stopTimeout = 15 * time.Second
)

// get returns the body of a GET, trimmed ("" on an error or a status other
// than 200).
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// TestRun_StartStop: a shard server started for real registers in etcd,
// takes every partition as the only server, and on its context's end stops
// within a bound, leaving the topology.
func TestRun_StartStop(t *testing.T) {
	url := pgtest.NewMigratedDB(t)
	e := etcdtest.Start(t)
	w := topology.NewWatcher(e.Client(), stock.Partitions)
	wctx, wcancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); w.Run(wctx) }()
	defer func() { wcancel(); <-watched }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout cmdtest.Output
	args := []string{"-addr", "127.0.0.1:0", "-id", "run1", "-database-url", url,
		"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-lease-ttl", "30s", "-log-level", "error"}
	done := make(chan error, 1)
	go func() { done <- shardcmd.Run(ctx, args, func(string) string { return "" }, &stdout, io.Discard) }()

	registered := func() bool { _, ok := w.Snapshot().Server("run1"); return ok }
	deadline := time.Now().Add(startTimeout)
	for !(registered() && w.Snapshot().AllOwned()) {
		select {
		case err := <-done:
			t.Fatalf("Run(%v) = %v before it registered", args, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run(%v) did not register and own every partition within %s", args, startTimeout)
		}
	}
	srv, _ := w.Snapshot().Server("run1")
	if !strings.Contains(stdout.String(), "shard run1 listening on "+srv.Addr) {
		t.Errorf("Run printed %q, want the address it registered (%s)", stdout.String(), srv.Addr)
	}
	// Ready once it owns its partitions; its ShardService calls counted.
	base := "http://" + srv.Addr
	deadline = time.Now().Add(5 * time.Second)
	for get(t, base+"/readyz") != "ready" {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %q 5 s after the server owned every partition, want ready", get(t, base+"/readyz"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And says so, with the address it registered, in its readiness line.
	if l := stdout.WaitReady(t, readiness.RoleShard, time.Second); l.ID != "run1" || l.Addr != base {
		t.Errorf("readiness line = %+v, want shard run1 at %s", l, base)
	}
	shardc := shardstockv1connect.NewShardServiceClient(transport.NewClient(), base)
	if _, err := shardc.Execute(ctx, connect.NewRequest(&v1.ExecuteRequest{})); err != nil {
		t.Errorf("Execute() = %v", err)
	}
	m := get(t, base+"/metrics")
	for _, want := range []string{
		`shardstock_rpc_calls_total{procedure="/shardstock.v1.ShardService/Execute"`,
		"shardstock_shard_partitions_owned 256",
		`shardstock_db_pool_connections{database="main",state="max"} 32`,
		"shardstock_shard_queue_depth 0",
		"shardstock_db_pool_waits_total",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}

	// /drain (the preStop hook) hands every partition over and leaves
	// the topology while the process runs on, not ready.
	if got := get(t, base+"/drain"); got != "drained" {
		t.Fatalf("/drain = %q, want drained", got)
	}
	for deadline := time.Now().Add(5 * time.Second); registered(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still registered 5 s after /drain")
		}
	}
	if got := get(t, base+"/readyz"); got == "ready" {
		t.Error("/readyz = ready after /drain")
	}
	if m := get(t, base+"/metrics"); !strings.Contains(m, "shardstock_shard_partitions_owned 0") {
		t.Error("/metrics does not show 0 partitions owned after /drain")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after its context ended = %v, want nil", err)
		}
	case <-time.After(stopTimeout):
		t.Fatalf("Run still running %s after its context ended", stopTimeout)
	}
	// It left the topology: its registration is gone at once, not with
	// its lease (30 s).
	deadline = time.Now().Add(5 * time.Second)
	for registered() {
		if time.Now().After(deadline) {
			t.Fatal("run1 still registered 5s after Run returned")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRun_OperatorAddr: with -operator-addr, /metrics is served on the
// operator listener and no longer on the shard port, which is left to
// allocators.
func TestRun_OperatorAddr(t *testing.T) {
	url := pgtest.NewMigratedDB(t)
	e := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ops := cmdtest.FreeAddr(t)
	var stdout cmdtest.Output
	args := []string{"-addr", "127.0.0.1:0", "-id", "ops1", "-database-url", url, "-operator-addr", ops,
		"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-lease-ttl", "30s", "-log-level", "error"}
	done := make(chan error, 1)
	go func() { done <- shardcmd.Run(ctx, args, func(string) string { return "" }, &stdout, io.Discard) }()
	base := stdout.WaitReady(t, readiness.RoleShard, startTimeout).Addr
	if m := get(t, "http://"+ops+"/metrics"); !strings.Contains(m, "shardstock_shard_partitions_owned 256") {
		t.Errorf("operator /metrics = %.200q, want the shard's metrics", m)
	}
	if get(t, "http://"+ops+"/readyz") != "ready" {
		t.Error("operator /readyz is not ready")
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics on the shard port = %d, want 404: metrics are on the operator port only", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after its context ended = %v, want nil", err)
		}
	case <-time.After(stopTimeout):
		t.Fatalf("Run still running %s after its context ended", stopTimeout)
	}
}
