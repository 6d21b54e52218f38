package topology

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardstock/shardstock/internal/etcdtest"
)

// testPartitions keeps the tests fast; Assign is tested at 256.
const testPartitions = 16

// ownershipLog is the shared record of which member believes it owns which
// partition, kept by every member's fakeOwner. It records a violation when
// two members believe they own one partition at once, when an epoch does
// not grow, or when Lose does not match an Acquire.
type ownershipLog struct {
	mu         sync.Mutex
	holder     map[int32]string
	lastEpoch  map[int32]int64
	attempts   map[int32]int
	acquires   map[string]int
	loses      map[string]int
	violations []string
}

func newLedger(t *testing.T) *ownershipLog {
	l := &ownershipLog{
		holder:    make(map[int32]string),
		lastEpoch: make(map[int32]int64),
		attempts:  make(map[int32]int),
		acquires:  make(map[string]int),
		loses:     make(map[string]int),
	}
	// Registered before any member, so it runs after they have stopped.
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, v := range l.violations {
			t.Error(v)
		}
	})
	return l
}

func (l *ownershipLog) violate(format string, args ...any) {
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

// holders returns, per server, the partitions it believes it owns.
func (l *ownershipLog) holders() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int)
	for _, s := range l.holder {
		out[s]++
	}
	return out
}

// fakeOwner records Acquire and Lose in an ownershipLog. fail, if set, may refuse
// an Acquire: attempt counts this partition's Acquire calls from 1.
type fakeOwner struct {
	l    *ownershipLog
	id   string
	fail func(p int32, attempt int) error
}

func (o *fakeOwner) Acquire(ctx context.Context, p int32, epoch int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := o.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts[p]++
	if o.fail != nil {
		if err := o.fail(p, l.attempts[p]); err != nil {
			return err
		}
	}
	if h, ok := l.holder[p]; ok {
		l.violate("Acquire(%d, %d) by %s while %s owns it", p, epoch, o.id, h)
	}
	if epoch <= l.lastEpoch[p] {
		l.violate("Acquire(%d, %d) by %s: epoch not above the last one, %d", p, epoch, o.id, l.lastEpoch[p])
	}
	l.holder[p] = o.id
	l.lastEpoch[p] = epoch
	l.acquires[o.id]++
	return nil
}

func (o *fakeOwner) Lose(p int32) {
	l := o.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.holder[p]; h != o.id {
		l.violate("Lose(%d) by %s, but the holder is %q", p, o.id, h)
		return
	}
	delete(l.holder, p)
	l.loses[o.id]++
}

// newClient returns a client of its own for endpoints, closed at cleanup.
func newClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("clientv3.New(%v) = %v", endpoints, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// runningMember is a Member running in a goroutine of the test.
type runningMember struct {
	*Member
	client *clientv3.Client
	cancel context.CancelFunc
	done   chan error

	stopOnce sync.Once
}

type memberOpts struct {
	endpoints []string      // default: the server's own
	leaseTTL  time.Duration // default: leaseTTLDefault, robust on a loaded machine
	abandon   bool
	fail      func(p int32, attempt int) error
}

// startMember runs a member with its own client and a fakeOwner in l. It
// stops at cleanup, if not before.
func startMember(t *testing.T, e *etcdtest.Etcd, l *ownershipLog, id string, o memberOpts) *runningMember {
	t.Helper()
	if o.endpoints == nil {
		o.endpoints = e.Endpoints()
	}
	c := newClient(t, o.endpoints)
	m := NewMember(MemberConfig{
		Client:     c,
		ServerID:   id,
		Addr:       "addr-" + id,
		Partitions: testPartitions,
		LeaseTTL:   o.leaseTTL,
		Owner:      &fakeOwner{l: l, id: id, fail: o.fail},
		Logger:     testLogger(t),
	})
	m.abandon = o.abandon
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningMember{Member: m, client: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the member and waits for Run to return nil. It may be
// called more than once.
func (r *runningMember) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	r.stopOnce.Do(func() {
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("%s: Run() = %v, want nil", r.cfg.ServerID, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s: Run did not return", r.cfg.ServerID)
		}
	})
}

// startWatcher runs a Watcher until cleanup.
func startWatcher(t *testing.T, c *clientv3.Client) *Watcher {
	t.Helper()
	return startWatcherLogged(t, c, testLogger(t))
}

// startWatcherLogged runs a Watcher logging to logger until cleanup.
func startWatcherLogged(t *testing.T, c *clientv3.Client, logger *slog.Logger) *Watcher {
	t.Helper()
	w := NewWatcher(c, testPartitions)
	w.logger = logger
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watcher.Run() = %v, want nil", err)
		}
	})
	return w
}

// waitView waits until cond holds for the watcher's view and returns it.
func waitView(t *testing.T, w *Watcher, timeout time.Duration, what string, cond func(View) bool) View {
	t.Helper()
	deadline := time.After(timeout)
	for {
		v := w.Snapshot()
		if cond(v) {
			return v
		}
		select {
		case <-v.Changed():
		case <-deadline:
			t.Fatalf("after %v: %s: not seen; last view: %s", timeout, what, describe(v))
		}
	}
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s: not seen", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ownedAsAssigned reports whether v has every partition owned by its
// assignee among exactly servers.
func ownedAsAssigned(servers ...string) func(View) bool {
	want := Assign(testPartitions, servers)
	return func(v View) bool {
		if len(v.Servers()) != len(servers) {
			return false
		}
		for p := range int32(testPartitions) {
			s, _, ok := v.Owner(p)
			if !ok || s.ID != want[p] {
				return false
			}
		}
		return true
	}
}

// watchFailures is a slog.Handler that keeps the errors a Watcher logs
// (its "err" attribute), so that a test can tell why a watch failed.
type watchFailures struct {
	mu   sync.Mutex
	errs []error
}

func (f *watchFailures) Enabled(context.Context, slog.Level) bool { return true }

func (f *watchFailures) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
			f.mu.Lock()
			f.errs = append(f.errs, err)
			f.mu.Unlock()
		}
		return true
	})
	return nil
}

func (f *watchFailures) WithAttrs([]slog.Attr) slog.Handler { return f }
func (f *watchFailures) WithGroup(string) slog.Handler      { return f }

// seen reports whether a logged error is target.
func (f *watchFailures) seen(target error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.errs, func(err error) bool { return errors.Is(err, target) })
}

func describe(v View) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev %d servers %v owners [", v.Revision(), v.Servers())
	for p := range int32(v.Partitions()) {
		o := v.owners[p]
		fmt.Fprintf(&b, " %d:%s@%d", p, o.server, o.epoch)
	}
	b.WriteString(" ]")
	return b.String()
}

// testLogger logs warnings through t with -v, and discards otherwise.
func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// proxy forwards TCP to target until cut, which drops every connection
// and refuses new ones: a network partition between a client and etcd.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: strings.TrimPrefix(target, "http://"), conns: make(map[net.Conn]bool)}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
	})
	return p
}

func (p *proxy) endpoints() []string { return []string{"http://" + p.ln.Addr().String()} }

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(in)
	}
}

func (p *proxy) forward(in net.Conn) {
	out, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		in.Close()
		return
	}
	if !p.track(in, out) {
		in.Close()
		out.Close()
		return
	}
	go func() { io.Copy(out, in); out.Close(); in.Close() }()
	io.Copy(in, out)
	in.Close()
	out.Close()
}

func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range conns {
		p.conns[c] = true
	}
	return true
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}
