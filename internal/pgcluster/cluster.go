// Package pgcluster runs a throwaway Postgres server from the local
// binaries (apt-get install postgresql): for tests (internal/pgtest starts
// one per test binary) and for local development (`make run`, the load
// generator). It imports no testing code, so that commands may link it.
package pgcluster

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/freeport"
	"github.com/shardstock/shardstock/internal/proc"
)

const (
	// pgLibDir is where Debian and Ubuntu install one bin directory per
	// Postgres major version.
	pgLibDir = "/usr/lib/postgresql"
	// installHint names the package that provides initdb and postgres.
	installHint = "apt-get install postgresql"
	// loopback is the address a cluster listens on unless its Host says.
	loopback = "127.0.0.1"
	// superuser is the role initdb creates; it matches CI's DATABASE_URL.
	superuser = "postgres"
	// osUser runs the server when we are root: postgres refuses to run as root.
	osUser = "postgres"
	// MaxConnsDefault is Start's max_connections: room for many parallel
	// tests, each with a pool.
	MaxConnsDefault = 300
	// portAttemptsMax bounds retries when another process takes the free
	// port between our probe and the server's bind.
	portAttemptsMax = 3
	// readyPollInterval is the pause between connection attempts at start.
	readyPollInterval = 50 * time.Millisecond
	// startTimeout bounds initdb plus server start (about 1.5 s normally).
	startTimeout = 60 * time.Second
	// stopTimeout bounds a fast shutdown (SIGINT), or an immediate one
	// (SIGQUIT, Crash), before we SIGKILL.
	stopTimeout = 30 * time.Second
)

// Cluster is a throwaway Postgres server run from the local binaries,
// listening on 127.0.0.1 (or its Host's address) on a port of its own with
// trust authentication.
type Cluster struct {
	maxConns  int  // the server's max_connections
	tls       *TLS // nil: no TLS
	host      Host
	url       string
	port      int
	dir       string
	removeDir bool
	cmd       *proc.Cmd
	exited    chan struct{} // closed once the server process has exited
	waitErr   error         // valid after exited is closed
	stopOnce  sync.Once
	stopErr   error
}

// Start initialises a cluster in dir/data (unless dir already holds one,
// which is reused) and starts it; it returns once the server accepts
// connections or ctx ends. An empty dir means a new temporary directory,
// removed by Stop. The server runs with fsync=off: fine for tests and local
// development, never for data you want to keep. The caller must call Stop;
// if the calling process dies first, the server gets SIGINT from the kernel
// (on Linux).
func Start(ctx context.Context, dir string) (*Cluster, error) {
	return StartMaxConns(ctx, dir, MaxConnsDefault)
}

// StartMaxConns is Start with max_connections set to maxConns.
func StartMaxConns(ctx context.Context, dir string, maxConns int) (*Cluster, error) {
	return startWith(ctx, dir, Host{}, maxConns, nil)
}

// Host is where a cluster's server runs: the address it listens on (and
// URL names), and the network namespace it runs in. The zero Host is
// 127.0.0.1 in this process's namespace.
type Host struct {
	// Addr is the IPv4 address to listen on; "" means 127.0.0.1. Other
	// than loopback, the server trusts clients of the subnets it is on
	// (pg_hba's samenet), as it trusts 127.0.0.1.
	Addr string
	// Netns names a network namespace (ip netns) to run the server in;
	// "" means this process's. It needs root and ip(8): the server is
	// started with `ip netns exec`, which only root may run, and drops to
	// the postgres OS user with setpriv(1) after it.
	Netns string
}

// StartHost is Start with the server on host: listening on host.Addr,
// inside host.Netns.
func StartHost(ctx context.Context, dir string, host Host) (*Cluster, error) {
	return startWith(ctx, dir, host, MaxConnsDefault, nil)
}

// TLS is what a Cluster serves TLS with: its certificate and key (PEM
// files, for 127.0.0.1) and the CA that signed them, which URL's clients
// verify the server against.
type TLS struct {
	CertFile, KeyFile, CAFile string
}

// StartTLS is Start serving TLS only: a TCP connection without TLS is
// refused, and URL verifies the server's certificate against tls.CAFile
// (sslmode=verify-full).
func StartTLS(ctx context.Context, dir string, tls TLS) (*Cluster, error) {
	return startWith(ctx, dir, Host{}, MaxConnsDefault, &tls)
}

func startWith(ctx context.Context, dir string, host Host, maxConns int, tls *TLS) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	if host.Addr == "" {
		host.Addr = loopback
	}
	c := &Cluster{dir: dir, maxConns: maxConns, tls: tls, host: host}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "pgcluster-"); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		c.removeDir = true
	}
	if err := c.start(ctx, binDir); err != nil {
		c.cleanDir()
		return nil, err
	}
	return c, nil
}

// URL returns a connection URL for the superuser's "postgres" database.
func (c *Cluster) URL() string { return c.url }

// Stop shuts the server down (fast shutdown, SIGKILL after stopTimeout) and
// removes the directory if Start created it. It is safe to call more
// than once; later calls return the first call's result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.stopServer()
		c.cleanDir()
	})
	return c.stopErr
}

// start prepares the directory, runs initdb if needed and launches the
// server, retrying with a new port if the first one was taken meanwhile.
func (c *Cluster) start(ctx context.Context, binDir string) error {
	cred, err := ServerCredential()
	if err != nil {
		return err
	}
	if err := ownDir(c.dir, cred); err != nil {
		return err
	}
	dataDir := filepath.Join(c.dir, "data")
	if err := initDB(ctx, binDir, dataDir, cred); err != nil {
		return err
	}
	if c.tls != nil {
		if err := requireTLS(dataDir, *c.tls, cred); err != nil {
			return err
		}
	}
	if c.host.Addr != loopback {
		if err := trustSameNet(dataDir); err != nil {
			return err
		}
	}
	for attempt := 1; ; attempt++ {
		err := c.launch(ctx, binDir, dataDir, cred, 0)
		if err == nil || attempt == portAttemptsMax || ctx.Err() != nil {
			return err
		}
	}
}

// launch starts postgres on port (0: a free one) and waits until it answers.
func (c *Cluster) launch(ctx context.Context, binDir, dataDir string, cred *syscall.Credential, port int) error {
	if port == 0 {
		// Another process may take it before postgres binds; start
		// retries in that case.
		p, err := freeport.Port()
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		port = p
	}
	c.port = port
	logPath := filepath.Join(c.dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer logFile.Close() // the child keeps its own copy of the descriptor
	args := []string{
		"-D", dataDir,
		"-p", strconv.Itoa(port),
		"-k", c.dir, // own socket dir: a system server may own /var/run/postgresql
		"-c", "listen_addresses=" + c.host.Addr,
		"-c", "fsync=off",
		"-c", "max_connections=" + strconv.Itoa(c.maxConns),
	}
	if c.tls != nil {
		args = append(args, "-c", "ssl=on", "-c", "ssl_cert_file="+serverCert, "-c", "ssl_key_file="+serverKey)
	}
	path := filepath.Join(binDir, "postgres")
	if c.host.Netns != "" {
		// ip execs setpriv, which execs postgres: one process, whose pid
		// is the server's, so that signals reach the server. ip needs
		// root, so the drop to the server's user is setpriv's; changing
		// user clears the parent-death signal, which setpriv sets again.
		wrap := []string{"netns", "exec", c.host.Netns}
		if cred != nil {
			wrap = append(wrap, "setpriv", "--reuid", strconv.Itoa(int(cred.Uid)), "--regid", strconv.Itoa(int(cred.Gid)),
				"--clear-groups", "--pdeathsig", "keep", "--")
			cred = nil
		}
		args = append(append(wrap, path), args...)
		path = "ip"
	}
	c.cmd = proc.Command(context.Background(), os.Interrupt, stopTimeout, path, args...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	// Its own process group, so that a terminal's Ctrl-C reaches only our
	// process (which then calls Stop); SIGINT if we die first, so that a
	// parent that crashes, or is killed by a test timeout, does not leave
	// the server running.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	c.cmd.DieWithParent(syscall.SIGINT)
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	c.exited = make(chan struct{})
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	c.url = fmt.Sprintf("postgres://%s@%s:%d/postgres?sslmode=disable", superuser, c.host.Addr, port)
	if c.tls != nil {
		c.url = fmt.Sprintf("postgres://%s@%s:%d/postgres?sslmode=verify-full&sslrootcert=%s", superuser, c.host.Addr, port, url.QueryEscape(c.tls.CAFile))
	}
	if err := c.waitReady(ctx); err != nil {
		c.stopServer()
		return fmt.Errorf("%w (log: %s)", err, logPath)
	}
	return nil
}

// waitReady polls until the server accepts a connection, the server exits,
// or ctx ends.
func (c *Cluster) waitReady(ctx context.Context) error {
	for {
		conn, err := pgx.Connect(ctx, c.url)
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-c.exited:
			return fmt.Errorf("pgcluster: postgres exited during start: %v", c.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: postgres not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(readyPollInterval):
		}
	}
}

// stopServer sends SIGINT (fast shutdown: abort sessions, then exit
// cleanly) and waits, falling back to SIGKILL after stopTimeout.
func (c *Cluster) stopServer() error { return c.stopWith(os.Interrupt) }

// stopWith sends the server sig and waits for it to exit, killing it after
// stopTimeout. A server that had exited already is no error; one that had
// to be killed is.
func (c *Cluster) stopWith(sig os.Signal) error {
	if c.cmd == nil || c.exited == nil {
		return nil
	}
	c.cmd.StopWith(sig)
	<-c.exited
	if proc.Killed(c.cmd.ProcessState) {
		return fmt.Errorf("pgcluster: %w", c.waitErr)
	}
	return nil
}

// cleanDir removes the directory if Start created it.
func (c *Cluster) cleanDir() {
	if c.removeDir {
		os.RemoveAll(c.dir)
	}
}

// findBinDir returns the bin directory of the newest Postgres under
// pgLibDir, or else the directory of initdb on PATH.
func findBinDir() (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(pgLibDir, "*", "bin"))
	versions := map[string]float64{}
	var found []string
	for _, d := range dirs {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		if err != nil || !isFile(filepath.Join(d, "initdb")) || !isFile(filepath.Join(d, "postgres")) {
			continue
		}
		versions[d] = v
		found = append(found, d)
	}
	if len(found) > 0 {
		sort.Slice(found, func(i, j int) bool { return versions[found[i]] > versions[found[j]] })
		return found[0], nil
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(initdb), nil
	}
	return "", fmt.Errorf("pgcluster: no Postgres server binaries (initdb, postgres) under %s/*/bin or on PATH; "+
		"install them with: %s (or set DATABASE_URL to a server with trust auth)", pgLibDir, installHint)
}

// isFile reports whether path names an existing regular file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// ServerCredential returns the credential to run initdb, postgres and pg_ctl with:
// nil (ourselves) unless we are root, which postgres refuses.
func ServerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(osUser)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root needs OS user %q to run postgres (%s creates it): %w",
			osUser, installHint, err)
	}
	uid, errU := strconv.ParseUint(u.Uid, 10, 32)
	gid, errG := strconv.ParseUint(u.Gid, 10, 32)
	if errU != nil || errG != nil {
		return nil, fmt.Errorf("pgcluster: user %q has non-numeric uid %q or gid %q", osUser, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// ownDir creates dir if needed and, when the server runs as another user,
// hands dir to that user so initdb can create the data directory and the
// server its socket in it.
func ownDir(dir string, cred *syscall.Credential) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if cred == nil {
		return nil
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// initDB runs initdb into dataDir (or copies what an earlier run wrote,
// initDBCached) unless a cluster is already there. --locale=C and UTF8
// make sorting and encoding identical on every machine.
func initDB(ctx context.Context, binDir, dataDir string, cred *syscall.Credential) error {
	if isFile(filepath.Join(dataDir, "PG_VERSION")) {
		return nil
	}
	return initDBCached(ctx, binDir, dataDir, []string{"-U", superuser, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"}, cred)
}

// runInitDB runs initdb with args into dataDir.
func runInitDB(ctx context.Context, binDir, dataDir string, args []string, cred *syscall.Credential) error {
	initdbRuns.Add(1)
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), append([]string{"-D", dataDir}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		hint := ""
		if cred != nil {
			hint = fmt.Sprintf("(initdb runs as OS user %s, which needs search permission on every parent of %s)\n",
				osUser, dataDir)
		}
		return fmt.Errorf("pgcluster: initdb %s: %w\n%s%s", dataDir, err, hint, out)
	}
	return nil
}

// trustSameNet adds to pg_hba.conf a line trusting clients of the subnets
// the server is on (initdb trusts only 127.0.0.1 and local sockets), once.
func trustSameNet(dataDir string) error {
	const line = "host all all samenet trust\n"
	path := filepath.Join(dataDir, "pg_hba.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if strings.Contains(string(b), line) {
		return nil // a reused data directory
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return fmt.Errorf("pgcluster: %w", err)
	}
	return f.Close()
}

// The server's certificate and key, in its data directory.
const (
	serverCert = "server.crt"
	serverKey  = "server.key"
)

// hbaTLSOnly trusts local sockets and TLS connections from 127.0.0.1, and
// refuses every TCP connection without TLS.
const hbaTLSOnly = `local all all trust
hostssl all all 127.0.0.1/32 trust
hostnossl all all 0.0.0.0/0 reject
hostnossl all all ::/0 reject
`

// requireTLS copies the certificate and key into dataDir, readable by the
// server's user only (postgres refuses a key others may read), and makes
// pg_hba.conf refuse TCP connections without TLS.
func requireTLS(dataDir string, tls TLS, cred *syscall.Credential) error {
	files := map[string]string{serverCert: tls.CertFile, serverKey: tls.KeyFile}
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("pgcluster: TLS: %w", err)
		}
		if err := writeOwned(filepath.Join(dataDir, dst), b, cred); err != nil {
			return err
		}
	}
	return writeOwned(filepath.Join(dataDir, "pg_hba.conf"), []byte(hbaTLSOnly), cred)
}

// writeOwned writes a file of mode 0600 owned by the server's user.
func writeOwned(path string, b []byte, cred *syscall.Credential) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}
