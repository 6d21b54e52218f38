package startup

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/topology"
)

// etcdRecheckInterval is how often a process whose etcd is behind its
// databases looks again (an operator bumps etcd's revision meanwhile).
const etcdRecheckInterval = 2 * time.Second

// EtcdCheck compares etcd's revision with the highest epoch or token the
// databases recorded (postgres.DB.HighestFence). Behind, etcd would hand
// out epochs and tokens every database refuses: a shard server would claim
// partitions it can never take over, and moves and CreateSku would be
// fenced. The process then says why it is not ready (Reason, /readyz, one
// log line) and looks again every etcdRecheckInterval until etcd is ahead
// (docs/operations.md, "etcd restored or rebuilt"). Once ahead it stays
// so: etcd's revision only grows while it is not restored again.
type EtcdCheck struct {
	dbs    *dbset.Set
	client *clientv3.Client
	log    *slog.Logger
	ok     chan struct{} // closed once etcd is ahead

	mu     sync.Mutex
	reason string
}

// CheckEtcd checks once now, and, if etcd is behind (or the check fails),
// again in the background until it is ahead or ctx ends.
func CheckEtcd(ctx context.Context, dbs *dbset.Set, client *clientv3.Client, log *slog.Logger) *EtcdCheck {
	c := &EtcdCheck{dbs: dbs, client: client, log: log, ok: make(chan struct{})}
	if c.check(ctx) {
		return c
	}
	go func() {
		t := time.NewTicker(etcdRecheckInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if c.check(ctx) {
					return
				}
			}
		}
	}()
	return c
}

// check looks once, and reports whether etcd is ahead.
func (c *EtcdCheck) check(ctx context.Context) bool {
	rev, err := topology.Revision(ctx, c.client)
	if err != nil {
		c.set(fmt.Sprintf("etcd revision unknown: %v", err))
		return false
	}
	for _, name := range c.dbs.Names() {
		fence, err := c.dbs.DB(name).HighestFence(ctx)
		if err != nil {
			c.set(fmt.Sprintf("database %q: highest fence unknown: %v", name, err))
			return false
		}
		if rev < fence {
			reason := fmt.Sprintf("etcd is behind the databases: its revision %d is below %d, the highest epoch or token database %q recorded "+
				"(etcd restored without --bump-revision, or rebuilt); bump it past %d: docs/operations.md, \"etcd restored or rebuilt\"",
				rev, fence, name, fence)
			if c.set(reason) {
				c.log.Error("not ready: "+reason, "etcd_revision", rev, "recorded_fence", fence, "database", name)
			}
			return false
		}
	}
	if c.set("") {
		c.log.Info("etcd is ahead of the databases' fences again", "etcd_revision", rev)
	}
	close(c.ok)
	return true
}

// set records reason ("" for none) and reports whether it changed.
func (c *EtcdCheck) set(reason string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := c.reason != reason
	c.reason = reason
	return changed
}

// Reason is why the process is not ready because of etcd, "" if it is
// ahead.
func (c *EtcdCheck) Reason() string {
	select {
	case <-c.ok:
		return ""
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reason == "" {
		return "etcd not checked yet"
	}
	return c.reason
}

// Wait returns once etcd is ahead, or with ctx's error.
func (c *EtcdCheck) Wait(ctx context.Context) error {
	select {
	case <-c.ok:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
