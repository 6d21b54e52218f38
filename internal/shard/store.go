package shard

import (
	"context"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Store is the storage a shard server writes through: the batch contract of
// internal/stock carried out in transactions, the fences, and the lookups
// of the read-only path and the sweeps. internal/postgres implements it
// (checked where the two are wired together, internal/shardnode).
//
// It is declared here, by its one consumer, rather than in the domain: it
// names only what the shard server needs, and a second store (another
// database, an in-memory one for a test) implements just this.
type Store interface {
	// Group runs the batches of many shards in one transaction; see
	// postgres.DB.Group for the failures it reports.
	Group(ctx context.Context, units []*stock.Unit) error
	// LookupOperations reads a SKU's operations of keys, by key.
	LookupOperations(ctx context.Context, sku string, keys []string) (map[string]*stock.Operation, error)
	LoadShard(ctx context.Context, k stock.ShardKey) (stock.Counts, error)
	CheckShard(ctx context.Context, f stock.Fence, k stock.ShardKey) (stock.ShardCheck, error)
	HaltShard(ctx context.Context, f stock.Fence, k stock.ShardKey, reason string) error
	TakeOver(ctx context.Context, partition int32, server string, epoch int64) error
	DueShards(ctx context.Context, partitions []int32, limit int) ([]stock.ShardKey, error)
	StaleTransfers(ctx context.Context, partitions []int32, age time.Duration, limit int) ([]stock.StaleStep, error)
	PruneCommitMarks(ctx context.Context) (int64, error)
	LostCommits() stock.LostCommits
	// Speculated counts the groups written in one round trip, and those
	// sent so that ran the usual way after all (postgres.DB.Speculated).
	Speculated() (committed, fellBack int64)
}
