package shardcmd_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/cmd/shardcmd"
	"github.com/shardstock/shardstock/internal/cmd/stockctlcmd"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
)

// readyz returns /readyz's status code and body (0 if it did not answer).
func readyz(base string) (int, string) {
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestRun_EtcdBehind: a shard server's database recorded epochs from an
// etcd that is gone; the server starts on a fresh etcd (as after a
// restore without --bump-revision, or a rebuilt cluster) whose revision
// is below them. It says why it is not ready, claims no partition, and
// comes back, without a restart, by the runbook's step: stockctl
// bump-etcd-revision past the number it names.
func TestRun_EtcdBehind(t *testing.T) {
	url := pgtest.NewMigratedDB(t)
	addr := cmdtest.FreeAddr(t)
	base := "http://" + addr
	start := func(e *etcdtest.Etcd) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		args := []string{"-addr", addr, "-id", "behind1", "-database-url", url,
			"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-lease-ttl", "30s", "-log-level", "error"}
		done := make(chan error, 1)
		go func() { done <- shardcmd.Run(ctx, args, func(string) string { return "" }, io.Discard, io.Discard) }()
		return func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run(%v) = %v", args, err)
				}
			case <-time.After(stopTimeout):
				t.Fatalf("Run(%v) did not stop within %s", args, stopTimeout)
			}
		}
	}
	waitReadyz := func(what string, ok func(code int, body string) bool) string {
		t.Helper()
		deadline := time.Now().Add(startTimeout)
		for {
			code, body := readyz(base)
			if ok(code, body) {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz = %d %q after %s, want %s", code, body, startTimeout, what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The old etcd: its revisions run well ahead of a new one's.
	old := etcdtest.Start(t)
	for i := range 1000 {
		if _, err := old.Client().Put(context.Background(), "/test/filler", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	stop := start(old)
	waitReadyz("ready", func(code int, body string) bool { return code == http.StatusOK })
	stop()

	ctx := context.Background()
	db, err := postgres.Open(ctx, url, postgres.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fence, err := db.HighestFence(ctx)
	if err != nil || fence < 1000 {
		t.Fatalf("HighestFence() = %d, %v; want the old etcd's epochs, over 1000", fence, err)
	}

	fresh := etcdtest.Start(t)
	stop = start(fresh)
	defer stop()
	body := waitReadyz("503 saying etcd is behind", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "etcd is behind")
	})
	if !strings.Contains(body, fmt.Sprint(fence)) {
		t.Errorf("/readyz = %q, want it to name the recorded fence %d", body, fence)
	}
	claimed, err := fresh.Client().Get(ctx, "/shardstock/partitions/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || claimed.Count != 0 {
		t.Errorf("partitions claimed in the fresh etcd while it is behind: %v, %v; want none", claimed.Count, err)
	}

	// The runbook: bump etcd's revision past the number the server named.
	var out strings.Builder
	args := []string{"bump-etcd-revision", "-etcd-endpoints", strings.Join(fresh.Endpoints(), ","), fmt.Sprint(fence)}
	if code := stockctlcmd.Run(ctx, args, func(string) string { return "" }, &out, &out); code != stockctlcmd.ExitOK {
		t.Fatalf("stockctl %v = exit %d: %s", args, code, out.String())
	}
	waitReadyz("ready after the bump", func(code int, _ string) bool { return code == http.StatusOK })
	if _, epoch, err := db.PartitionOwner(ctx, 0); err != nil || epoch <= fence {
		t.Errorf("partition 0's epoch after the bump = %d, %v; want above %d (taken over)", epoch, err, fence)
	}
}
