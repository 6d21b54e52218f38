// Package topology keeps shard-server membership and partition ownership in
// etcd, and gives allocators a read-only view of it.
//
// A shard server runs one Member. The Member registers the server under
// /shardstock/servers/<id>, bound to its own lease, and claims every
// partition that rendezvous hashing (Assign) gives it by creating
// /shardstock/partitions/<p>, bound to the same lease and only if absent.
// The key's CreateRevision is the partition's fencing epoch: etcd revisions
// only grow, so every takeover gets a larger epoch than any before it. The
// Member hands each claimed partition to its Owner (Acquire: bump the
// Postgres fence to the epoch) and takes it back (Lose: stop writing) when
// the partition moves to another server, when the key disappears, or when
// the lease may have expired.
//
// etcd alone cannot stop a paused or partitioned server from writing: the
// Postgres fence does that (see the architecture's fencing paragraph). This
// package keeps the window in which two servers believe they own a partition
// as small as it can: a Member stops writing before it releases a key, and
// it gives up its partitions on its own clock before its lease can have
// expired at the server (see lease.go).
//
// Allocators run a Watcher: a consistent, immutable View of servers and
// owners, replaced and signalled on every change.
package topology

import (
	"context"
	"errors"
	"time"
)

// Owner is the shard server side: it starts and stops writing partitions.
//
// Acquire may be called concurrently for different partitions. For one
// partition, calls never overlap, and every Acquire that returned nil is
// followed by exactly one Lose before the next Acquire of that partition.
type Owner interface {
	// Acquire fences partition p at epoch in the database before any write.
	Acquire(ctx context.Context, partition int32, epoch int64) error
	// Lose stops all writes to partition p at once. It must return
	// promptly: the Member releases the key only after it returns.
	Lose(partition int32)
}

// Server is one registered shard server.
type Server struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// Limits. Every etcd call has requestTimeout or a shorter deadline; every
// retry loop backs off up to its ...Max and gives up after its ...RetriesMax
// consecutive failures.
const (
	leaseTTLDefault = 5 * time.Second
	requestTimeout  = 5 * time.Second
	acquireTimeout  = 10 * time.Second

	// partitionsMax keeps partition keys fixed-width (%03d), so that they
	// sort in partition order.
	partitionsMax  = 1000
	serverIDLenMax = 64
	addrLenMax     = 256

	// claimsInFlightMax bounds concurrent claim-and-Acquire calls of one
	// Member: enough to own 256 partitions in well under a lease TTL.
	claimsInFlightMax    = 16
	claimRetryBackoffMin = 100 * time.Millisecond
	claimRetryBackoffMax = 5 * time.Second

	sessionRetryBackoffMin = 200 * time.Millisecond
	sessionRetryBackoffMax = 5 * time.Second
	sessionRetriesMax      = 100 // about 8 minutes without etcd

	resyncBackoffMin = 100 * time.Millisecond
	resyncBackoffMax = 3 * time.Second
	resyncRetriesMax = 200 // about 10 minutes without etcd
)

// Errors.
var (
	// ErrInvalidConfig is returned by Run for a configuration it cannot use.
	ErrInvalidConfig = errors.New("topology: invalid config")
	// errLeaseLost ends a session whose lease expired or may have expired.
	errLeaseLost = errors.New("topology: lease lost")
)
