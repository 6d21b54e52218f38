package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// promoteWait bounds how long Promote waits for the standby to leave
// recovery: replaying what it had received, under the tests' load.
const promoteWait = 60 * time.Second

// StartStandby takes a base backup of c (pg_basebackup -R -X stream: the
// backup carries the settings and the connection to c it streams from)
// into a new temporary directory and starts it as a streaming standby of c
// on a port of its own. name is its application_name at c, the name
// synchronous_standby_names matches. The standby listens on 127.0.0.1,
// and streams from c there: c must be on the zero Host. It inherits c's
// postgresql.auto.conf: call SetSynchronousStandbys after StartStandby, so
// that the standby, once promoted, does not itself wait for a standby.
// The caller must call Stop.
func (c *Cluster) StartStandby(ctx context.Context, name string) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := ServerCredential()
	if err != nil {
		return nil, err
	}
	s := &Cluster{maxConns: c.maxConns, host: Host{Addr: loopback}, removeDir: true}
	if s.dir, err = os.MkdirTemp("", "pgcluster-standby-"); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := ownDir(s.dir, cred); err != nil {
		s.cleanDir()
		return nil, err
	}
	dataDir := filepath.Join(s.dir, "data")
	if c.host.Addr != loopback || c.host.Netns != "" {
		return nil, errors.New("pgcluster: a standby of a cluster on another host is not built")
	}
	conninfo := fmt.Sprintf("host=%s port=%d user=%s application_name=%s", loopback, c.port, superuser, name)
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pg_basebackup"),
		"-D", dataDir, "-d", conninfo, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		s.cleanDir()
		return nil, fmt.Errorf("pgcluster: pg_basebackup from port %d: %w\n%s", c.port, err, out)
	}
	for attempt := 1; ; attempt++ {
		err := s.launch(ctx, binDir, dataDir, cred, 0)
		if err == nil {
			return s, nil
		}
		if attempt == portAttemptsMax || ctx.Err() != nil {
			s.cleanDir()
			return nil, err
		}
	}
}

// SetSynchronousStandbys sets c's synchronous_standby_names (ALTER SYSTEM,
// then a reload): with names non-empty, every commit waits until a named
// standby has flushed it. "" makes replication asynchronous again.
func (c *Cluster) SetSynchronousStandbys(ctx context.Context, names string) error {
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = `+quoteLiteral(names)); err != nil {
		return fmt.Errorf("pgcluster: set synchronous_standby_names: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("pgcluster: reload: %w", err)
	}
	return nil
}

// WaitSyncStandby waits until a standby named name streams from c as a
// synchronous one (pg_stat_replication.sync_state = 'sync'), or ctx ends.
func (c *Cluster) WaitSyncStandby(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND sync_state = 'sync'`, name).Scan(&n)
		switch {
		case err != nil:
			return fmt.Errorf("pgcluster: wait for standby %s: %w", name, err)
		case n > 0:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: standby %s not synchronous: %w", name, ctx.Err())
		case <-time.After(readyPollInterval):
		}
	}
}

// Promote makes a standby a primary and returns once it accepts writes.
// It asks without waiting (pg_promote(false)) and then polls in short
// queries: a query that waited for the promotion would hold a snapshot
// while the standby replays what it had received, and any record that
// removes rows newer than that snapshot (a VACUUM's) cancels it after
// max_standby_streaming_delay ("conflict with recovery", SQLSTATE 40001),
// while the promotion goes on (TestPromote_ReplayConflict).
func (c *Cluster) Promote(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, promoteWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var asked bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(false)`).Scan(&asked); err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	if !asked {
		return errors.New("pgcluster: promote: the standby refused the promotion")
	}
	for {
		var recovering bool
		err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering)
		if err == nil && !recovering {
			return nil
		}
		// An error here is a poll cancelled by a conflict as above, or
		// the deadline, which the select below reports.
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: promote: the standby did not leave recovery in %s (last poll: %v)", promoteWait, err)
		case <-time.After(readyPollInterval):
		}
	}
}

// Port returns the port the server listens on.
func (c *Cluster) Port() int { return c.port }

// quoteLiteral quotes s as an SQL string literal (ALTER SYSTEM takes no
// parameters).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// StartSyncPair starts a primary and one streaming standby of it, named
// name, and makes the standby synchronous: once it returns, every commit
// on the primary waits until the standby has flushed it. The caller must
// Stop both; on an error, whatever was started is stopped.
func StartSyncPair(ctx context.Context, name string) (primary, standby *Cluster, err error) {
	if primary, err = Start(ctx, ""); err != nil {
		return nil, nil, err
	}
	if standby, err = primary.StartStandby(ctx, name); err != nil {
		primary.Stop()
		return nil, nil, err
	}
	if err = primary.SetSynchronousStandbys(ctx, name); err == nil {
		err = primary.WaitSyncStandby(ctx, name)
	}
	if err != nil {
		standby.Stop()
		primary.Stop()
		return nil, nil, err
	}
	return primary, standby, nil
}
