package shardnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/shardstock/shardstock/internal/dbset"
	"github.com/shardstock/shardstock/internal/postgres"
)

// RequireSyncStandbyUsage documents the -require-sync-standby flag of both
// commands that run a shard server.
const RequireSyncStandbyUsage = "refuse to start unless every commit waits for a synchronous standby " +
	"(synchronous_standby_names set, synchronous_commit on or remote_apply), so that a failover loses no acknowledged sale; " +
	"set it in production (env SHARDSTOCK_REQUIRE_SYNC_STANDBY=1)"

// CheckDurabilityAll is CheckDurability of every database of dbs.
func CheckDurabilityAll(ctx context.Context, dbs *dbset.Set, requireSyncStandby bool, log *slog.Logger) error {
	for _, name := range dbs.Names() {
		if err := CheckDurability(ctx, dbs.DB(name), requireSyncStandby, log.With("database", name)); err != nil {
			return fmt.Errorf("database %q: %w", name, err)
		}
	}
	return nil
}

// CheckDurability refuses a database whose settings could lose a commit
// that a shard server acknowledged, and logs the weaker promises it
// accepts. A shard server calls it before it takes any partition.
func CheckDurability(ctx context.Context, db *postgres.DB, requireSyncStandby bool, log *slog.Logger) error {
	d, err := db.Durability(ctx)
	if err != nil {
		return err
	}
	problems, warnings := d.Check(requireSyncStandby)
	for _, w := range warnings {
		log.Warn("database durability: " + w)
	}
	if len(problems) > 0 {
		return errors.New("database durability: " + strings.Join(problems, "; "))
	}
	log.Info("database durability", "synchronous_commit", d.SynchronousCommit, "fsync", d.Fsync,
		"synchronous_standby_names", d.SynchronousStandbyNames, "standbys", d.Standbys)
	return nil
}
