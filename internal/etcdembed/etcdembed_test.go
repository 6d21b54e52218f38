package etcdembed

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStart(t *testing.T) {
	t.Run("TempDir", func(t *testing.T) {
		e := startServer(t, "")
		e.Close()
		if _, err := os.Stat(e.dir); !os.IsNotExist(err) {
			t.Fatalf("Stat(%s) after Close = %v, want not exist", e.dir, err)
		}
		e.Close() // a second Close is harmless
	})
	t.Run("ReuseDir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "dev")
		first := startServer(t, dir)
		put(t, first.Client(), "k", "kept")
		first.Close()
		second := startServer(t, dir)
		if got := get(t, second.Client(), "k"); got != "kept" {
			t.Fatalf("Get(k) after restart = %q, want %q", got, "kept")
		}
	})
}

// startServer starts a server in dir, closed at the end of the test.
func startServer(t *testing.T, dir string) *Server {
	t.Helper()
	e, err := Start(context.Background(), dir)
	if err != nil {
		t.Fatalf("Start(%q) = %v", dir, err)
	}
	t.Cleanup(e.Close)
	return e
}

// put writes key, failing the test on error.
func put(t *testing.T, c *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, value); err != nil {
		t.Fatalf("Put(%s) = %v", key, err)
	}
}

// get reads key, returning "" if it does not exist.
func get(t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%s) = %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}
