// Package pgcrash crash-restarts a private Postgres cluster while a load
// runs: `pg_ctl stop -m immediate` (every server process is killed at once,
// with no shutdown checkpoint, as in a power cut of the server's processes),
// then a start on the same data directory with the options of its last
// start (the same port), every few seconds, a bounded number of times. The
// load generator uses it to prove from outside that a sale acknowledged
// before a crash is still in the books after it.
//
// It refuses a cluster on the machine's shared port (5432), and one whose
// port is not the one the load's database URL names: it only ever crashes
// the private cluster under test.
package pgcrash

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/pgcluster"
)

// Limits of a crash loop.
const (
	// CountMax bounds the crashes of one loop.
	CountMax = 100
	// EveryMin keeps crashes far enough apart for Postgres to recover
	// (crash recovery plus start take 1 to 4 s here under load).
	EveryMin = time.Second
	// uptimeMin is the least time Postgres answers between two crashes,
	// whatever the schedule: the clients must get work done between them.
	uptimeMin = time.Second
	// sharedPort is the machine's shared Postgres, which other engineers
	// use: never crash it.
	sharedPort = 5432
	// pgctlTimeout bounds each pg_ctl call (its -t as well).
	pgctlTimeout = 60 * time.Second
	// answerTimeout bounds the wait for Postgres to answer after a start;
	// answerPoll is the pause between tries, answerTryTimeout each try's
	// deadline.
	answerTimeout    = 60 * time.Second
	answerPoll       = 20 * time.Millisecond
	answerTryTimeout = time.Second
	// pgLibDir is where Debian installs one bin directory per major version.
	pgLibDir = "/usr/lib/postgresql"
)

// Config is a crash loop's parameters.
type Config struct {
	// DataDir is the cluster's data directory (postmaster.pid lives there).
	DataDir string
	// URL is the cluster's connection URL: its port must be the running
	// cluster's, and Postgres is asked SELECT 1 on it after each start.
	URL string
	// Every is the time from the loop's start to the first crash, and
	// from one crash's start to the next (at least uptimeMin after
	// Postgres answered again); Count is how many crashes (1 to CountMax).
	Every time.Duration
	Count int
	// Log, when set, receives a line per crash.
	Log io.Writer
}

// Crash is one crash-restart.
type Crash struct {
	At time.Time // when the immediate stop began
	// Stopped is how long pg_ctl stop -m immediate took; Down is the time
	// from the stop's start until Postgres answered SELECT 1 again.
	Stopped, Down time.Duration
	Err           error // why it did not come back, if it did not
}

// Result is what a loop did.
type Result struct {
	Planned int
	Every   time.Duration
	Crashes []Crash // crash-restarts that were made, failed ones included
}

// Done counts the crash-restarts after which Postgres answered again.
func (r Result) Done() int {
	n := 0
	for _, c := range r.Crashes {
		if c.Err == nil {
			n++
		}
	}
	return n
}

// Loop is a running crash loop.
type Loop struct {
	cfg    Config
	pgctl  string
	cred   *syscall.Credential
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	res    Result
}

// Start checks that cfg names a running private cluster and starts
// crashing it: the first crash Every from now. It fails at once on a
// cluster it must not or cannot crash.
func Start(ctx context.Context, cfg Config) (*Loop, error) {
	if cfg.Count < 1 || cfg.Count > CountMax {
		return nil, fmt.Errorf("pgcrash: count %d: want 1 to %d", cfg.Count, CountMax)
	}
	if cfg.Every < EveryMin {
		return nil, fmt.Errorf("pgcrash: every %s: want at least %s", cfg.Every, EveryMin)
	}
	if err := checkCluster(cfg.DataDir, cfg.URL); err != nil {
		return nil, err
	}
	pgctl, err := findPgCtl(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	cred, err := pgcluster.ServerCredential()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Loop{cfg: cfg, pgctl: pgctl, cred: cred, cancel: cancel, done: make(chan struct{}),
		res: Result{Planned: cfg.Count, Every: cfg.Every}}
	go l.run(ctx)
	return l, nil
}

// Finished is closed when the loop has made its last crash-restart (or
// stopped after one that failed).
func (l *Loop) Finished() <-chan struct{} { return l.done }

// Stop ends the loop, waits for a crash-restart in progress to finish
// (Postgres answering again) and returns what the loop did.
func (l *Loop) Stop() Result {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.res
}

func (l *Loop) run(ctx context.Context) {
	defer close(l.done)
	next := time.Now().Add(l.cfg.Every)
	for i := 1; i <= l.cfg.Count; i++ {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		// A crash once begun is carried to its end (Postgres answering
		// again) even if the loop is stopped meanwhile: what runs after
		// the load needs the database.
		c := l.crash(context.WithoutCancel(ctx))
		l.mu.Lock()
		l.res.Crashes = append(l.res.Crashes, c)
		l.mu.Unlock()
		if l.cfg.Log != nil {
			if c.Err != nil {
				fmt.Fprintf(l.cfg.Log, "pgcrash: crash %d/%d at %s: %v\n", i, l.cfg.Count, c.At.Format("15:04:05.000"), c.Err)
			} else {
				fmt.Fprintf(l.cfg.Log, "pgcrash: crash %d/%d at %s: pg_ctl stop -m immediate took %s; Postgres answered again %s after the stop began\n",
					i, l.cfg.Count, c.At.Format("15:04:05.000"), c.Stopped.Round(time.Millisecond), c.Down.Round(time.Millisecond))
			}
		}
		if c.Err != nil {
			return // a cluster that did not come back is not crashed again
		}
		// On schedule, Every after this crash began, unless the recovery
		// took so long that Postgres would not answer for uptimeMin first.
		next = c.At.Add(l.cfg.Every)
		if earliest := time.Now().Add(uptimeMin); next.Before(earliest) {
			next = earliest
		}
	}
}

// crash stops the cluster with an immediate shutdown, starts it again with
// its last options (pg_ctl restart on a stopped cluster does exactly that:
// it reads postmaster.opts), and waits until it answers SELECT 1.
func (l *Loop) crash(ctx context.Context) Crash {
	c := Crash{At: time.Now()}
	if err := l.pgCtl(ctx, "stop", "-m", "immediate"); err != nil {
		c.Err = err
		return c
	}
	c.Stopped = time.Since(c.At)
	// restart prints "PID file ... does not exist; trying to start server
	// anyway": the expected path after a stop.
	if err := l.pgCtl(ctx, "restart", "-l", filepath.Join(filepath.Dir(l.cfg.DataDir), "postgres.log")); err != nil {
		c.Err = err
		return c
	}
	if err := waitAnswer(ctx, l.cfg.URL); err != nil {
		c.Err = err
		return c
	}
	c.Down = time.Since(c.At)
	return c
}

// pgCtl runs pg_ctl command on the cluster, waiting for it to finish.
func (l *Loop) pgCtl(ctx context.Context, command string, opts ...string) error {
	ctx, cancel := context.WithTimeout(ctx, pgctlTimeout+5*time.Second)
	defer cancel()
	args := append([]string{"-D", l.cfg.DataDir, "-w", "-t", strconv.Itoa(int(pgctlTimeout / time.Second))}, opts...)
	args = append(args, command)
	cmd := exec.CommandContext(ctx, l.pgctl, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred}
	// pg_ctl -l sends the started server's output to the log, so the
	// server holds no pipe of ours open and CombinedOutput returns.
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcrash: pg_ctl %s: %w: %s", command, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// waitAnswer polls until Postgres answers SELECT 1 on url.
func waitAnswer(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, answerTimeout)
	defer cancel()
	var last error
	for {
		try, cancelTry := context.WithTimeout(ctx, answerTryTimeout)
		conn, err := pgx.Connect(try, url)
		if err == nil {
			_, err = conn.Exec(try, "SELECT 1")
			conn.Close(try)
		}
		cancelTry()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcrash: Postgres did not answer within %s of its start: %v", answerTimeout, last)
		case <-time.After(answerPoll):
		}
	}
}

// checkCluster refuses a cluster that is not running, or that runs on the
// shared port, or on another port than url's.
func checkCluster(dataDir, rawURL string) error {
	if dataDir == "" || rawURL == "" {
		return errors.New("pgcrash: a data directory and the cluster's URL are needed")
	}
	port, err := pidPort(dataDir)
	if err != nil {
		return err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("pgcrash: URL: %w", err)
	}
	switch host := u.Hostname(); host {
	case "127.0.0.1", "localhost", "::1":
	default:
		return fmt.Errorf("pgcrash: URL host %q: only a cluster on this machine (127.0.0.1) is crashed", host)
	}
	urlPort, _ := strconv.Atoi(u.Port())
	switch {
	case port == sharedPort:
		return fmt.Errorf("pgcrash: %s runs on port %d, the shared server: refusing to crash it", dataDir, sharedPort)
	case urlPort != port:
		return fmt.Errorf("pgcrash: %s runs on port %d, but the URL names port %q: not the cluster under test", dataDir, port, u.Port())
	}
	return nil
}

// pidPort reads the running cluster's port from its postmaster.pid (the
// fourth line).
func pidPort(dataDir string) (int, error) {
	f, err := os.Open(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgcrash: no running cluster in %s: %w", dataDir, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for i := 1; s.Scan(); i++ {
		if i == 4 {
			p, err := strconv.Atoi(strings.TrimSpace(s.Text()))
			if err != nil {
				return 0, fmt.Errorf("pgcrash: %s/postmaster.pid: port %q", dataDir, s.Text())
			}
			return p, nil
		}
	}
	return 0, fmt.Errorf("pgcrash: %s/postmaster.pid: no port line", dataDir)
}

// findPgCtl returns the pg_ctl of the cluster's major version (PG_VERSION),
// else the one on PATH.
func findPgCtl(dataDir string) (string, error) {
	if v, err := os.ReadFile(filepath.Join(dataDir, "PG_VERSION")); err == nil {
		p := filepath.Join(pgLibDir, strings.TrimSpace(string(v)), "bin", "pg_ctl")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("pg_ctl")
	if err != nil {
		return "", fmt.Errorf("pgcrash: no pg_ctl for %s under %s or on PATH", dataDir, pgLibDir)
	}
	return p, nil
}
