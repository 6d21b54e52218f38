package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	shardstockv1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/freeport"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/proc"
	"github.com/shardstock/shardstock/internal/readiness"
)

// Bounds of a stack that loadgen starts.
const (
	stackReadyTimeout = 2 * time.Minute
	// stackStopTimeout is what the dev stack gets to stop after SIGTERM
	// (it gives its own children 15 s) before it is killed.
	stackStopTimeout = 30 * time.Second
	pgTimeout        = 10 * time.Second // each administrative statement
	// stackConnsMax is how many Postgres connections the dev stack's pools
	// may open by default: three shard servers of 32 and an allocator of 16
	// (fewer with -stack-args such as -shard-servers 0 -allocator-shard).
	stackConnsMax = 3*32 + 16
	connsSpare    = 10
	// localServerURL is a Postgres with trust auth on the usual port.
	localServerURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	profileGrace   = 30 * time.Second // beyond the profile's own seconds
	// The stack says it is ready once every partition has an owner, which
	// may be while partitions still move to the shard servers that joined
	// last: the run starts once the owners stayed put for settleQuiet.
	settleQuiet   = 2 * time.Second
	settleTimeout = 30 * time.Second
	settlePoll    = 200 * time.Millisecond
	// olderStackGrace: a stack built before the readiness line (make
	// bench-ab's BASE may be one) never prints it. It counts as ready once
	// its allocator's /readyz has answered 200 for this long: a stack that
	// prints the line does so within moments of that (it creates one SKU).
	olderStackGrace = 10 * time.Second
	readyzTimeout   = 2 * time.Second // each /readyz of an older stack
)

// stackConfig configures startStack.
type stackConfig struct {
	Bin string // the shardstock-dev binary
	// ServerURL is the Postgres server to create the stack's database on;
	// empty: 127.0.0.1:5432 if it answers with enough free connections,
	// else a throwaway cluster.
	ServerURL string
	// ServerNote names ServerURL's server in the output; default
	// "Postgres HOST:PORT (given)".
	ServerNote    string
	BaselineConns int // connections the Postgres baselines will open
	LogPath       string
	Pprof         bool     // serve /debug/pprof on every process of the stack
	Args          []string // the stack's own flags, e.g. -shard-servers 0 -allocator-shard
	Stderr        io.Writer
}

// stack is a running dev stack: Postgres-backed shard servers and an
// allocator on 127.0.0.1, with embedded etcd.
type stack struct {
	baseURL, token      string
	serviceToken        string // the service role's: the load's InventoryService calls
	opsURL              string // the allocator's operator listener (/metrics, /debug/pprof)
	databaseURL, dbNote string
	logPath             string

	cmd     *proc.Cmd
	exited  chan struct{}
	waitErr error
	output  sync.WaitGroup

	shardURLs map[string]string // shard server id -> URL, from the readiness line
	cleanups  []func() error    // run in reverse by stop
}

// startStack starts the dev stack and returns once it says it is ready
// (its readiness line, package readiness).
func startStack(ctx context.Context, cfg stackConfig) (s *stack, err error) {
	s = &stack{exited: make(chan struct{})}
	defer func() {
		if err != nil {
			if serr := s.stop(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}()
	bin, err := filepath.Abs(cfg.Bin)
	if err != nil {
		return s, err
	}
	if err := s.database(ctx, cfg); err != nil {
		return s, err
	}
	port, err := freeport.Port()
	if err != nil {
		return s, err
	}
	s.baseURL = "http://127.0.0.1:" + strconv.Itoa(port)
	opsPort, err := freeport.Port()
	if err != nil {
		return s, err
	}
	s.opsURL = "http://127.0.0.1:" + strconv.Itoa(opsPort)
	s.token, s.serviceToken = randomHex(16), randomHex(16)

	var log *os.File
	if cfg.LogPath != "" {
		log, err = os.Create(cfg.LogPath)
	} else {
		log, err = os.CreateTemp("", "loadgen-stack-*.log")
	}
	if err != nil {
		return s, err
	}
	s.logPath = log.Name()
	s.cleanups = append(s.cleanups, log.Close)

	pprofOn := ""
	if cfg.Pprof {
		pprofOn = "1"
	}
	// Stopped by stop, not by a context: the stack outlives start-up.
	s.cmd = proc.Command(context.Background(), syscall.SIGTERM, stackStopTimeout, bin, cfg.Args...)
	// Later entries win: the stack gets its own address, token, database
	// and an embedded etcd whatever this process's environment says.
	s.cmd.Env = append(os.Environ(),
		"SHARDSTOCK_ADDR=127.0.0.1:"+strconv.Itoa(port),
		"SHARDSTOCK_OPERATOR_ADDR=127.0.0.1:"+strconv.Itoa(opsPort),
		"SHARDSTOCK_ADMIN_TOKEN="+s.token,
		"SHARDSTOCK_SERVICE_TOKEN="+s.serviceToken,
		"DATABASE_URL="+s.databaseURL,
		"ETCD_ENDPOINTS=",
		"SHARDSTOCK_PPROF="+pprofOn,
	)
	ready, err := s.startLogged(bin, log)
	if err != nil {
		return s, err
	}
	fmt.Fprintf(cfg.Stderr, "loadgen: stack: starting %s on %s (log %s)\n", cfg.Bin, s.baseURL, s.logPath)
	return s, s.waitReady(ctx, ready, cfg.Stderr)
}

// startLogged starts s.cmd with its stdout and stderr copied to log, and
// returns the channel its readiness line, read from its stdout, arrives
// on. s.exited closes once it has exited.
func (s *stack) startLogged(bin string, log *os.File) (<-chan readiness.Line, error) {
	// If loadgen dies, the stack is told to stop, and stops its children.
	s.cmd.DieWithParent(syscall.SIGTERM)
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	ready := make(chan readiness.Line, 1)
	var logMu sync.Mutex
	copyLines := func(r io.Reader, wait bool) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			fmt.Fprintln(log, line)
			logMu.Unlock()
			if l, ok := readiness.Parse(line); wait && ok && l.Role == readiness.RoleDev {
				ready <- l
				wait = false
			}
		}
		_, _ = io.Copy(io.Discard, r)
	}
	s.output.Add(2)
	go func() { defer s.output.Done(); copyLines(stdout, true) }()
	go func() { defer s.output.Done(); copyLines(stderr, false) }()
	go func() {
		s.output.Wait()
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	return ready, nil
}

// waitReady waits until the stack is ready (its readiness line on ready,
// or, for an older stack, its /readyz) and its partitions settled.
func (s *stack) waitReady(ctx context.Context, ready <-chan readiness.Line, stderr io.Writer) error {
	t := time.NewTimer(stackReadyTimeout)
	defer t.Stop()
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	older := make(chan struct{})
	go s.waitOlderStack(pollCtx, older)
	select {
	case <-older:
		fmt.Fprintf(stderr, "loadgen: stack: no readiness line, but /readyz answered 200 for %s: an older stack (no shard server profiles)\n", olderStackGrace)
	case l := <-ready:
		s.shardURLs = make(map[string]string, len(l.Shards))
		for _, sh := range l.Shards {
			s.shardURLs[sh.ID] = sh.Addr
		}
	case <-s.exited:
		return fmt.Errorf("the stack exited during start-up (%v); see %s", s.waitErr, s.logPath)
	case <-t.C:
		return fmt.Errorf("the stack was not ready within %s; see %s", stackReadyTimeout, s.logPath)
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.settle(ctx, stderr)
}

// settle waits until every one of the stack's shard servers owns
// partitions and ownership has not changed for settleQuiet, or until
// settleTimeout passed (then it warns and goes on).
func (s *stack) settle(ctx context.Context, stderr io.Writer) error {
	admin := shardstockv1connect.NewAdminServiceClient(http.DefaultClient, s.baseURL)
	start := time.Now()
	var last string
	stableSince := start
	for {
		req := connect.NewRequest(&shardstockv1.GetTopologyRequest{})
		req.Header().Set("Authorization", "Bearer "+s.token)
		cctx, cancel := context.WithTimeout(ctx, pgTimeout)
		resp, err := admin.GetTopology(cctx, req)
		cancel()
		if err == nil {
			var b strings.Builder
			for _, o := range resp.Msg.GetOwners() {
				fmt.Fprintf(&b, "%d=%s@%d ", o.GetPartition(), o.GetServerId(), o.GetEpoch())
			}
			serving := 0
			for _, srv := range resp.Msg.GetServers() {
				if len(srv.GetPartitions()) > 0 {
					serving++
				}
			}
			// The stack was ready once every registered server owned its
			// rendezvous share; what is left is to see it hold still.
			complete := serving >= 1 && len(resp.Msg.GetOwners()) == int(resp.Msg.GetPartitions())
			if now := b.String(); now != last || !complete {
				last, stableSince = now, time.Now()
			} else if time.Since(stableSince) >= settleQuiet {
				fmt.Fprintf(stderr, "loadgen: stack: partitions settled over %d shard servers in %s\n",
					len(resp.Msg.GetServers()), time.Since(start).Round(time.Millisecond))
				return nil
			}
		}
		if time.Since(start) > settleTimeout {
			fmt.Fprintf(stderr, "loadgen: stack: warning: partition owners still changing after %s (last error: %v); starting anyway\n", settleTimeout, err)
			return nil
		}
		if err := s.alive(); err != nil {
			return err
		}
		if !loadgen.Sleep(ctx, settlePoll) {
			return ctx.Err()
		}
	}
}

// database picks the Postgres server and creates a database of the run's
// own on it, dropped by stop: every run starts from empty tables, and a
// stack restarted with a fresh etcd never meets fencing epochs of an
// earlier one.
func (s *stack) database(ctx context.Context, cfg stackConfig) error {
	server, note := cfg.ServerURL, ""
	need := stackConnsMax + cfg.BaselineConns + connsSpare
	if server != "" {
		note = cfg.ServerNote
		if note == "" {
			note = "Postgres " + hostOf(server) + " (given)"
		}
		if free, err := freeConns(ctx, server); err == nil && free < need {
			fmt.Fprintf(cfg.Stderr, "loadgen: stack: warning: %s has %d free connections; the stack may open %d and the baselines %d\n",
				hostOf(server), free, stackConnsMax, cfg.BaselineConns)
		}
	} else if free, err := freeConns(ctx, localServerURL); err == nil && free >= need {
		server, note = localServerURL, "Postgres 127.0.0.1:5432"
	} else {
		if err == nil {
			fmt.Fprintf(cfg.Stderr, "loadgen: stack: 127.0.0.1:5432 has %d free connections, the stack may open %d and the baselines %d: using a throwaway cluster\n",
				free, stackConnsMax, cfg.BaselineConns)
		}
		fmt.Fprintln(cfg.Stderr, "loadgen: stack: starting a throwaway Postgres cluster")
		c, err := pgcluster.Start(ctx, "")
		if err != nil {
			return err
		}
		s.cleanups = append(s.cleanups, c.Stop)
		server, note = c.URL(), "a throwaway Postgres cluster on "+hostOf(c.URL())+" (fsync=off)"
	}

	name := "loadgen_" + randomHex(4)
	dbURL, err := withDatabase(server, name)
	if err == nil {
		// template0 is never in use, unlike template1 on a shared server.
		err = execOn(ctx, server, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0")
	}
	if err != nil {
		fmt.Fprintf(cfg.Stderr, "loadgen: stack: could not create a database of its own (%v): using the URL's\n", err)
		s.databaseURL, s.dbNote = server, note
		return nil
	}
	s.cleanups = append(s.cleanups, func() error {
		return execOn(context.Background(), server, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	s.databaseURL, s.dbNote = dbURL, note+", database "+name
	return nil
}

// waitOlderStack closes older once the allocator's /readyz has answered
// 200 for olderStackGrace, unless ctx ends first.
func (s *stack) waitOlderStack(ctx context.Context, older chan<- struct{}) {
	hc := &http.Client{Timeout: readyzTimeout}
	var since time.Time
	for loadgen.Sleep(ctx, settlePoll) {
		resp, err := hc.Get(s.opsURL + "/readyz")
		if err != nil || resp.StatusCode != http.StatusOK {
			since = time.Time{}
		} else if since.IsZero() {
			since = time.Now()
		}
		if err == nil {
			resp.Body.Close()
		}
		if !since.IsZero() && time.Since(since) >= olderStackGrace {
			close(older)
			return
		}
	}
}

// alive reports an error if the stack has exited.
func (s *stack) alive() error {
	select {
	case <-s.exited:
		return fmt.Errorf("the stack exited (%v); see %s", s.waitErr, s.logPath)
	default:
		return nil
	}
}

// stop sends SIGTERM, waits up to stackStopTimeout, kills the stack if it
// is still there, then drops its database and stops what startStack
// started for it.
func (s *stack) stop() error {
	var errs []error
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Stop()
		<-s.exited
		if proc.Killed(s.cmd.ProcessState) {
			errs = append(errs, fmt.Errorf("the stack: %w", s.waitErr))
		}
		s.cmd = nil
	}
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		if err := s.cleanups[i](); err != nil {
			errs = append(errs, err)
		}
	}
	s.cleanups = nil
	return errors.Join(errs...)
}

// freeConns returns how many more client connections the server at url
// admits, less the ones it keeps for superusers.
func freeConns(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var free int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&free)
	return free, err
}

func execOn(ctx context.Context, url, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase returns url naming database name instead of its own.
func withDatabase(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("not a postgres:// URL")
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String(), nil
}

// hostOf returns the host:port of a Postgres URL, never its password.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return "the given server"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// serverProfiles fetches CPU profiles of the allocator and every shard
// server of a stack over one load.
type serverProfiles struct {
	dir, prefix string
	seconds     int
	stack       *stack
	stderr      io.Writer
	wg          sync.WaitGroup
}

// start begins one profile per process; the runner calls it as the load
// begins.
func (p *serverProfiles) start() {
	procs := map[string]string{"allocator": p.stack.opsURL} // its operator listener serves the profiles
	maps.Copy(procs, p.stack.shardURLs)                     // each serves its profiles on its shard port
	secs := max(p.seconds, 1)
	for name, base := range procs {
		p.wg.Go(func() {
			path := filepath.Join(p.dir, p.prefix+"-"+name+".pprof")
			if err := fetchProfile(base, secs, path); err != nil {
				fmt.Fprintf(p.stderr, "loadgen: profile of %s: %v\n", name, err)
			}
		})
	}
}

// wait waits for every profile to be written.
func (p *serverProfiles) wait() { p.wg.Wait() }

func fetchProfile(base string, seconds int, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second+profileGrace)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/profile?seconds="+strconv.Itoa(seconds), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s (is /debug/pprof served? the stack needs SHARDSTOCK_PPROF=1)", req.URL, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
