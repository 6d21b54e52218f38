package etcdtest

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStart(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		e := Start(t)
		put(t, e.Client(), "k", "v1")
		if got := get(t, e.Client(), "k"); got != "v1" {
			t.Fatalf("Get(k) = %q, want %q", got, "v1")
		}
	})
	t.Run("OwnClient", func(t *testing.T) {
		e := Start(t)
		c, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("New(%v) = %v", e.Endpoints(), err)
		}
		defer c.Close()
		put(t, c, "k", "v2")
		if got := get(t, e.Client(), "k"); got != "v2" {
			t.Fatalf("Get(k) = %q, want %q", got, "v2")
		}
	})
	t.Run("Isolated", func(t *testing.T) {
		a, b := Start(t), Start(t)
		if port(t, a) == port(t, b) {
			t.Fatalf("Endpoints() = %v and %v, want different ports", a.Endpoints(), b.Endpoints())
		}
		put(t, a.Client(), "k", "a")
		if got := get(t, b.Client(), "k"); got != "" {
			t.Fatalf("Get(k) on second server = %q, want none", got)
		}
	})
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

// port returns the port of the server's only endpoint, which must not be 0.
func port(t *testing.T, e *Etcd) string {
	t.Helper()
	eps := e.Endpoints()
	if len(eps) != 1 {
		t.Fatalf("Endpoints() = %v, want one", eps)
	}
	u, err := url.Parse(eps[0])
	if err != nil || u.Port() == "" || u.Port() == "0" {
		t.Fatalf("Endpoints() = %v, want a real port (%v)", eps, err)
	}
	return u.Port()
}
