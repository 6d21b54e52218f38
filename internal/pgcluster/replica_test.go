package pgcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPromote_ReplayConflict promotes a standby whose replay, on its way
// to the end of recovery, cancels every query holding a snapshot older
// than the rows it removes (a recovery conflict, as after a standby's
// crash under load): Promote must not be such a query, or the promotion
// it asked for is reported as failed (SQLSTATE 40001) while it goes on.
func TestPromote_ReplayConflict(t *testing.T) {
	t.Parallel() // clusters of its own: directories, ports, processes
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := startCluster(t, "")
	standby, err := primary.StartStandby(ctx, "promoted")
	if err != nil {
		t.Fatalf("StartStandby() = %v, want nil", err)
	}
	t.Cleanup(func() { standby.Stop() })
	p := connect(t, primary.URL())
	execSQL(t, p, "CREATE TABLE churn (id int PRIMARY KEY, n int) WITH (autovacuum_enabled = false); INSERT INTO churn SELECT g, 0 FROM generate_series(1, 1000) g")
	var lsn string
	scanOne(t, p, &lsn, "SELECT pg_current_wal_lsn()::text")
	s := connect(t, standby.URL())
	waitLSN(ctx, t, s, "pg_last_wal_replay_lsn", lsn)

	// Replay waits 100 ms for a conflicting query, then cancels it; and
	// it is paused, so that what follows reaches the standby unreplayed.
	execSQL(t, s, "ALTER SYSTEM SET max_standby_streaming_delay = '100ms'")
	execSQL(t, s, "ALTER SYSTEM SET max_standby_archive_delay = '100ms'")
	execSQL(t, s, "SELECT pg_reload_conf()")
	execSQL(t, s, "SELECT pg_wal_replay_pause()")
	// Dead rows, then a VACUUM that removes them: its records conflict
	// with every snapshot the standby takes before replaying them.
	for i := 0; i < 5; i++ {
		execSQL(t, p, "UPDATE churn SET n = n + 1")
	}
	execSQL(t, p, "VACUUM churn")
	scanOne(t, p, &lsn, "SELECT pg_current_wal_lsn()::text")
	waitLSN(ctx, t, s, "pg_last_wal_receive_lsn", lsn)

	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("Promote() with replay conflicting = %v, want nil", err)
	}
	s = connect(t, standby.URL())
	execSQL(t, s, "UPDATE churn SET n = 0 WHERE id = 1") // a primary now
	var n int
	scanOne(t, s, &n, "SELECT count(*) FROM churn WHERE n = 5")
	if n != 999 {
		t.Fatalf("rows replayed to n = 5 on the promoted standby = %d, want 999", n)
	}
}

// waitLSN waits until the standby's position that at names
// (pg_last_wal_replay_lsn or pg_last_wal_receive_lsn) reaches lsn.
func waitLSN(ctx context.Context, t *testing.T, standby *pgx.Conn, at, lsn string) {
	t.Helper()
	for {
		var done bool
		scanOne(t, standby, &done, "SELECT coalesce("+at+"() >= $1::pg_lsn, false)", lsn)
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("standby's %s did not reach %s: %v", at, lsn, ctx.Err())
		case <-time.After(readyPollInterval):
		}
	}
}
