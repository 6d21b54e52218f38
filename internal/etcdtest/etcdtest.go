// Package etcdtest gives a test an embedded single-member etcd
// (internal/etcdembed) of its own, closed when the test ends.
package etcdtest

import (
	"context"
	"testing"

	"github.com/shardstock/shardstock/internal/etcdembed"
)

// Etcd is a running embedded etcd server with a client connected to it.
type Etcd = etcdembed.Server

// Start starts a server with its data in a new temporary directory and
// closes it, client included, in tb.Cleanup.
func Start(tb testing.TB) *Etcd {
	tb.Helper()
	e, err := etcdembed.Start(context.Background(), "")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	return e
}
