package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/memory"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	"github.com/shardstock/shardstock/internal/proc"
	"github.com/shardstock/shardstock/internal/readiness"
)

// serveMemoryArg, as loadgen's first argument, makes the process the
// memory target's server (internal/loadgen/memory) instead of the load
// generator: `loadgen serve-memory -addr 127.0.0.1:0`. It is how the memory
// target starts its own process.
const serveMemoryArg = "serve-memory"

// Bounds of the memory target's process.
const (
	memoryStartTimeout = 10 * time.Second
	// memoryStopTimeout is what the server gets to stop after SIGTERM
	// before it is killed: its graceful shutdown takes at most 10 s.
	memoryStopTimeout = 15 * time.Second
)

// serveMemory serves the memory target's API on -addr, says where in its
// readiness line (role serve-memory) and serves until ctx
// ends (SIGINT, SIGTERM) or stdin closes, so that it stops when the
// process that started it dies.
func serveMemory(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen "+serveMemoryArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (port 0 picks one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", serveMemoryArg, fs.Args())
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("%s: %w", serveMemoryArg, err)
	}
	return serveChild(ctx, serveMemoryArg, l, stdin, stdout, memory.Serve)
}

// serveChild says in its readiness line (role) where l listens, and serves
// l with serve until ctx ends or stdin closes: the process that started
// this one holds its stdin, so a child of loadgen stops when it dies.
func serveChild(ctx context.Context, role string, l net.Listener, stdin io.Reader, stdout io.Writer,
	serve func(context.Context, net.Listener) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	if err := readiness.Announce(ctx, stdout, readiness.Line{Role: role, Addr: "http://" + l.Addr().String()}, nil); err != nil {
		l.Close()
		return err
	}
	return serve(ctx, l)
}

// memoryTarget is the memory target: the shardstock client driving a
// memory server in a child process of its own (this executable, run as
// `serve-memory`), started by the first Setup and stopped by Close. It is
// the ceiling of the public API over Connect on the machine, measured as
// a baseline.
type memoryTarget struct{ childTarget }

var _ loadgen.Target = (*memoryTarget)(nil)

func newMemoryTarget(options) loadgen.Target { return &memoryTarget{} }

// Name is loadgen.CeilingTarget ("memory").
func (t *memoryTarget) Name() string { return loadgen.CeilingTarget }

// Baseline is true: the memory target is measured for comparison.
func (t *memoryTarget) Baseline() bool { return true }

// Setup starts the server on first use, then creates the SKUs through it.
func (t *memoryTarget) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	if err := t.start(ctx, serveMemoryArg, "-addr", "127.0.0.1:0"); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	return t.Target.Setup(ctx, skus)
}

// childTarget is the shardstock client driving a server that this
// process runs as a child of its own (this executable in a serve-* role):
// the memory and redis-api targets.
type childTarget struct {
	*shardstock.Target // nil until start
	server             *serverProcess
}

// start starts the server (args, a serve-* role first) on first use and
// points the client at it.
func (t *childTarget) start(ctx context.Context, args ...string) error {
	return t.startWith(ctx, shardstock.Config{}, args...)
}

// startWith is start with the client's settings in cfg (its tokens); the
// address is the server's.
func (t *childTarget) startWith(ctx context.Context, cfg shardstock.Config, args ...string) error {
	if t.server != nil {
		return nil
	}
	p, err := startServer(ctx, args...)
	if err != nil {
		return err
	}
	t.server = p
	cfg.Addr = p.baseURL
	t.Target = shardstock.New(cfg)
	return nil
}

// ServerPid is the server's process, once started.
func (t *childTarget) ServerPid() int {
	if t.server == nil || t.server.cmd.Process == nil {
		return 0
	}
	return t.server.cmd.Process.Pid
}

// Close closes the client's connections and stops the server.
func (t *childTarget) Close() error {
	var errs []error
	if t.Target != nil {
		errs = append(errs, t.Target.Close())
	}
	if t.server != nil {
		errs = append(errs, t.server.stop())
		t.server = nil
	}
	return errors.Join(errs...)
}

// serverProcess is a running `loadgen serve-*` (serve-memory, serve-redis-api).
type serverProcess struct {
	baseURL string
	cmd     *proc.Cmd
	stdin   io.WriteCloser
	exited  chan struct{}
	waitErr error
}

// startServer starts this executable with args (a serve-* role first) and
// returns once it printed its readiness line (package readiness) as that
// role, with the URL it serves on.
func startServer(ctx context.Context, args ...string) (p *serverProcess, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p = &serverProcess{exited: make(chan struct{})}
	// Not Setup's context: the server outlives it, until Close.
	p.cmd = proc.Command(context.Background(), syscall.SIGTERM, memoryStopTimeout, exe, args...)
	p.cmd.Stderr = os.Stderr
	// A group of its own: a Ctrl-C in the terminal stops loadgen's load,
	// which still verifies through the server before Close stops it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The server stops when its stdin closes: when this process dies, too.
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", exe, args[0], err)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l, ok := readiness.Parse(sc.Text()); ok && l.Role == args[0] {
				select {
				case addrc <- l.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()

	t := time.NewTimer(memoryStartTimeout)
	defer t.Stop()
	select {
	case p.baseURL = <-addrc:
		return p, nil
	case <-p.exited:
		p.stdin.Close()
		return nil, fmt.Errorf("the server exited during start-up: %v", p.waitErr)
	case <-t.C:
		err = fmt.Errorf("the server did not listen within %s", memoryStartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	return nil, errors.Join(err, p.stop())
}

// stop sends SIGTERM, waits up to memoryStopTimeout and kills the server
// if it is still there.
func (p *serverProcess) stop() error {
	defer p.stdin.Close()
	p.cmd.Stop()
	<-p.exited
	if p.waitErr != nil {
		return fmt.Errorf("the memory server: %w", p.waitErr)
	}
	return nil
}
