package postgres

import (
	"context"
	"fmt"
)

// Durability is what the database's settings promise of a commit it has
// acknowledged, as this pool's sessions see them.
type Durability struct {
	// SynchronousCommit is on, remote_apply, remote_write, local or off.
	SynchronousCommit string
	Fsync             bool
	// SynchronousStandbyNames names the standbys a commit waits for; ""
	// means none: replication, if any, is asynchronous.
	SynchronousStandbyNames string
	// Standbys counts the standbys streaming from this server now.
	Standbys int
	// InRecovery: this server is itself a standby (read-only).
	InRecovery bool
}

// Durability reads the settings on one of the pool's connections.
func (db *DB) Durability(ctx context.Context) (Durability, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var d Durability
	var fsync string
	err := db.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync'),
		current_setting('synchronous_standby_names'), (SELECT count(*) FROM pg_stat_replication), pg_is_in_recovery()`).
		Scan(&d.SynchronousCommit, &fsync, &d.SynchronousStandbyNames, &d.Standbys, &d.InRecovery)
	if err != nil {
		return d, fmt.Errorf("postgres: reading durability settings: %w", err)
	}
	d.Fsync = fsync == "on"
	return d, nil
}

// Check says why a commit acknowledged under d could later be missing:
// problems that must stop a shard server from starting, and warnings to
// log. requireSyncStandby is a production deployment's demand that every
// commit be on a standby before it is acknowledged, so that a failover
// loses nothing.
func (d Durability) Check(requireSyncStandby bool) (problems, warnings []string) {
	if d.InRecovery {
		problems = append(problems, "the database is a standby in recovery (read-only): point DATABASE_URL at the primary")
	}
	if d.SynchronousCommit == "off" {
		problems = append(problems, "synchronous_commit=off acknowledges a commit before its WAL is flushed: "+
			"a crash of Postgres loses sales that clients were told of; set it to on (or remote_apply with a synchronous standby)")
	}
	if !d.Fsync {
		warnings = append(warnings, "fsync=off: an operating-system crash or power loss may lose acknowledged sales "+
			"(acceptable for a throwaway development cluster only)")
	}
	syncStandby := d.SynchronousStandbyNames != "" && d.SynchronousCommit != "local" && d.SynchronousCommit != "off"
	switch {
	case requireSyncStandby && !syncStandby:
		problems = append(problems, fmt.Sprintf("synchronous replication is required but not in force "+
			"(synchronous_standby_names=%q, synchronous_commit=%s): a failover to a standby could lose acknowledged sales; "+
			"set synchronous_standby_names and synchronous_commit=on or remote_apply", d.SynchronousStandbyNames, d.SynchronousCommit))
	case syncStandby && d.SynchronousCommit == "remote_write":
		warnings = append(warnings, "synchronous_commit=remote_write acknowledges a commit the standby has written but not flushed: "+
			"a failover loses it if the standby's operating system crashes with the primary; set it to on or remote_apply")
	case !syncStandby && d.Standbys > 0:
		warnings = append(warnings, fmt.Sprintf("%d standbys replicate asynchronously: a failover to one may lose the last "+
			"acknowledged sales; set synchronous_standby_names (and synchronous_commit=on or remote_apply)", d.Standbys))
	}
	return problems, warnings
}
