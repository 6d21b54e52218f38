package pgcluster

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
)

// Crash stops the server the way a crash does: SIGQUIT to the postmaster,
// which is what `pg_ctl stop -m immediate` sends. Every backend exits at
// once without a checkpoint; the next start replays the WAL (crash
// recovery), so only commits whose WAL record reached the log survive, and
// transaction ids that never reached it are handed out again.
func (c *Cluster) Crash() error {
	if c.cmd == nil || c.exited == nil {
		return errors.New("pgcluster: crash: server not running")
	}
	return c.stopWith(syscall.SIGQUIT)
}

// Restart starts the server again on its data directory and port, after
// Crash (crash recovery) or a stop, and returns once it answers.
func (c *Cluster) Restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	select {
	case <-c.exited:
	default:
		return errors.New("pgcluster: restart: server still running")
	}
	binDir, err := findBinDir()
	if err != nil {
		return err
	}
	cred, err := ServerCredential()
	if err != nil {
		return err
	}
	return c.launch(ctx, binDir, filepath.Join(c.dir, "data"), cred, c.port)
}
