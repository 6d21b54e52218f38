package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/pause"
	"github.com/shardstock/shardstock/internal/stock"
)

// leaseTTLMax bounds LeaseTTL: a longer lease only delays takeovers.
const leaseTTLMax = time.Minute

// MemberConfig configures a Member.
type MemberConfig struct {
	Client *clientv3.Client
	// ServerID names the shard server. It must be unique among live
	// servers: two members with one id would delete each other's keys.
	ServerID string
	// Addr is where allocators reach the server.
	Addr string
	// Partitions is the number of partitions; 0 means stock.Partitions.
	Partitions int
	// LeaseTTL is the lease time-to-live, rounded up to whole seconds (etcd
	// may raise it to its minimum); 0 means 5 s. A dead server's
	// partitions move after at most about this long.
	LeaseTTL time.Duration
	Owner    Owner
	Logger   *slog.Logger // nil means slog.Default()
}

// Member registers one shard server and keeps it the owner of exactly the
// partitions that Assign gives it among the registered servers.
type Member struct {
	cfg    MemberConfig
	logger *slog.Logger

	// abandon is a test hook. When Run returns, the member stops writing
	// (Lose) but neither releases its keys nor revokes its lease, like a
	// process that died: others take over when the lease expires.
	abandon bool

	mu    sync.Mutex
	owned map[int32]int64
	// settled: registered and owning exactly the partitions assigned to
	// it in its last view (Settled).
	settled atomic.Bool
}

// NewMember returns a Member for cfg, with defaults filled in. Run checks
// the configuration.
func NewMember(cfg MemberConfig) *Member {
	if cfg.Partitions == 0 {
		cfg.Partitions = stock.Partitions
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = leaseTTLDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Member{
		cfg:    cfg,
		logger: cfg.Logger.With("server", cfg.ServerID),
		owned:  make(map[int32]int64),
	}
}

// Settled reports whether the member is registered and owns exactly the
// partitions that rendezvous hashing assigns it among the servers it sees:
// a shard server's readiness. False while partitions move to or from it.
func (m *Member) Settled() bool { return m.settled.Load() }

// Owned returns the partitions this member owns, by epoch: those whose
// Acquire succeeded and that have not been lost since.
func (m *Member) Owned() map[int32]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.owned)
}

func (m *Member) setOwned(owned map[int32]int64) {
	m.mu.Lock()
	m.owned = maps.Clone(owned)
	m.mu.Unlock()
}

func (m *Member) validate() error {
	c := m.cfg
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: no etcd client", ErrInvalidConfig)
	case c.Owner == nil:
		return fmt.Errorf("%w: no owner", ErrInvalidConfig)
	case len(c.Addr) > addrLenMax:
		return fmt.Errorf("%w: addr longer than %d bytes", ErrInvalidConfig, addrLenMax)
	case c.Partitions < 1 || c.Partitions > partitionsMax:
		return fmt.Errorf("%w: partitions %d not in 1..%d", ErrInvalidConfig, c.Partitions, partitionsMax)
	case c.LeaseTTL < 0 || c.LeaseTTL > leaseTTLMax:
		return fmt.Errorf("%w: lease TTL %v not in 0..%v", ErrInvalidConfig, c.LeaseTTL, leaseTTLMax)
	}
	return validServerID(c.ServerID)
}

// Run registers the server and keeps its partitions until ctx is done.
// When the lease is lost it loses every partition, then registers again
// with a new lease. On return it has called Lose for every partition it
// owned and revoked its lease, which deletes its registration and
// ownership keys at once, so that others take over without waiting for an
// expiry. It returns nil when ctx is done, and an error for an invalid
// configuration or when etcd has been unreachable for minutes
// (sessionRetriesMax consecutive failed sessions, or the watcher giving
// up). Run must not be called again before it returns.
func (m *Member) Run(ctx context.Context) error {
	if err := m.validate(); err != nil {
		return err
	}
	w := NewWatcher(m.cfg.Client, m.cfg.Partitions)
	w.logger = m.logger
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	var watchErr error
	go func() {
		defer close(watchDone)
		watchErr = w.Run(wctx)
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()

	failures := 0
	for {
		registered, err := m.session(ctx, w, watchDone)
		if ctx.Err() != nil {
			return nil
		}
		select {
		case <-watchDone:
			return fmt.Errorf("topology: member %s: %w", m.cfg.ServerID, watchErr)
		default:
		}
		if registered {
			failures = 0
		}
		failures++
		if failures > sessionRetriesMax {
			return fmt.Errorf("topology: member %s: %d consecutive failed sessions: %w", m.cfg.ServerID, failures-1, err)
		}
		m.logger.Warn("topology: session ended, registering again", "err", err, "failures", failures)
		if !pause.For(ctx, backoff(failures, sessionRetryBackoffMin, sessionRetryBackoffMax)) {
			return nil
		}
	}
}

// session runs one lease: grant, register, own partitions until the lease
// is lost or ctx is done, then lose everything and revoke. registered
// reports whether the registration succeeded.
func (m *Member) session(ctx context.Context, w *Watcher, watchDone <-chan struct{}) (registered bool, err error) {
	l, err := grantLease(ctx, m.cfg.Client, m.cfg.LeaseTTL)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	keepAliveDone := make(chan struct{})
	go func() {
		defer close(keepAliveDone)
		l.keepAlive(sctx, m.logger)
	}()

	s := newSession(m, l)
	err = s.register(sctx)
	registered = err == nil
	if registered {
		m.logger.Info("topology: registered", "addr", m.cfg.Addr, "lease", int64(l.id), "lease_ttl", l.ttl)
		err = s.loop(sctx, w, watchDone)
	}

	// Whatever ended the session, this member stops writing now: before
	// anything else can fail or wait.
	s.loseAll()
	cancel() // stops the keep-alives and cancels Acquire calls in flight
	s.drain()
	<-keepAliveDone
	if m.abandon {
		return registered, err
	}
	// Revoke even a lease that counts as lost: if the server still holds
	// it, its keys go now rather than at its expiry.
	if rerr := l.revoke(ctx); rerr != nil {
		m.logger.Warn("topology: revoke lease failed; its keys go when it expires", "lease", int64(l.id), "err", rerr)
	}
	return registered, err
}

// session is one lease's worth of ownership. Only the loop's goroutine
// touches its fields; claim goroutines report through results.
type session struct {
	m      *Member
	lease  *lease
	me     string
	regRev int64 // revision of the registration: the view's servers must reach it

	owned   map[int32]int64 // Acquired partitions, by epoch
	pending map[int32]bool  // claim or Acquire in flight
	// seenRev is, per partition, the revision of this member's last write
	// to its key: the partition is not acted on until the view's partitions
	// have caught up with that write, so a lagging view cannot undo it.
	seenRev  []int64
	failures []int // consecutive failed claims, per partition
	retryAt  []time.Time
	// releaseFailures counts consecutive rounds with a failed release.
	releaseFailures int

	results chan claimResult // capacity: one per partition, never blocks
	claims  sync.WaitGroup
}

type claimResult struct {
	p        int32
	epoch    int64
	rev      int64 // this member's last write to the key, or the key's revision if taken
	acquired bool
	err      error
}

func newSession(m *Member, l *lease) *session {
	n := m.cfg.Partitions
	return &session{
		m:        m,
		lease:    l,
		me:       m.cfg.ServerID,
		owned:    make(map[int32]int64),
		pending:  make(map[int32]bool),
		seenRev:  make([]int64, n),
		failures: make([]int, n),
		retryAt:  make([]time.Time, n),
		results:  make(chan claimResult, n),
	}
}

// register puts the server's key, bound to the session's lease. A key left
// by an earlier lease of this server is overwritten and rebound.
func (s *session) register(ctx context.Context) error {
	b, err := json.Marshal(Server{ID: s.me, Addr: s.m.cfg.Addr})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := s.m.cfg.Client.Put(rctx, serverKey(s.me), string(b), clientv3.WithLease(s.lease.id))
	if err != nil {
		return fmt.Errorf("topology: register: %w", err)
	}
	s.regRev = resp.Header.Revision
	return nil
}

// loop converges ownership with each new view, claim result and retry
// time until ctx is done (nil), the lease is lost or the watcher fails.
func (s *session) loop(ctx context.Context, w *Watcher, watchDone <-chan struct{}) error {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		// Checked first, so that no new claim starts once the session is over.
		select {
		case <-ctx.Done():
			return nil
		case <-s.lease.Lost():
			return errLeaseLost
		case <-watchDone:
			return errors.New("topology: watcher stopped")
		default:
		}
		v := w.Snapshot()
		next := s.converge(ctx, v)
		s.m.settled.Store(s.settled(v))
		if next.IsZero() {
			retry.Stop()
		} else {
			retry.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
		case <-s.lease.Lost():
		case <-watchDone:
		case <-v.Changed():
		case r := <-s.results:
			s.finish(r)
		case <-retry.C:
		}
	}
}

// converge moves ownership one step toward the assignment in v. It
// returns when it wants to run again without a new view (zero: no need).
func (s *session) converge(ctx context.Context, v View) (next time.Time) {
	if v.serversRev < s.regRev {
		return time.Time{} // the view has not seen the registration yet
	}
	now := time.Now()
	if _, ok := v.servers[s.me]; !ok {
		// The registration is gone though the lease lives (deleted by
		// hand). Register again; the view will show it.
		if err := s.register(ctx); err != nil {
			s.m.logger.Warn("topology: register again failed", "err", err)
			return now.Add(claimRetryBackoffMax)
		}
		return time.Time{}
	}
	assigned := Assign(s.m.cfg.Partitions, slices.Collect(maps.Keys(v.servers)))
	var releases []release
	for p := range int32(s.m.cfg.Partitions) {
		if s.pending[p] || v.partitionsRev < s.seenRev[p] {
			continue
		}
		k := v.owners[p]
		epoch, owned := s.owned[p]
		mine := assigned[p] == s.me
		switch {
		case owned && (k.epoch != epoch || k.server != s.me):
			// The key is gone (expired, deleted by hand) or belongs to
			// someone else: stop writing; there is nothing to release.
			s.lose(p, "ownership key lost")
		case owned && !mine:
			// Hand over: stop writing first, then delete the key so that
			// the assignee can claim it.
			s.lose(p, "reassigned")
			releases = append(releases, release{p, epoch})
		case owned:
			// Owned and assigned: nothing to do.
		case k.epoch != 0 && k.server == s.me:
			// Our key but not Acquired: left by a failed Acquire whose
			// undo failed, or by an earlier lease. Delete it; a new claim
			// gets a new epoch.
			releases = append(releases, release{p, k.epoch})
		case k.epoch == 0 && mine:
			if now.Before(s.retryAt[p]) {
				if next.IsZero() || s.retryAt[p].Before(next) {
					next = s.retryAt[p]
				}
				continue
			}
			if len(s.pending) >= claimsInFlightMax {
				continue // a finishing claim runs converge again
			}
			s.startClaim(ctx, p)
		}
	}
	if !s.releaseAll(ctx, releases) {
		s.releaseFailures++
		retry := now.Add(backoff(s.releaseFailures, claimRetryBackoffMin, claimRetryBackoffMax))
		if next.IsZero() || retry.Before(next) {
			next = retry
		}
	} else {
		s.releaseFailures = 0
	}
	return next
}

// settled reports whether the member owns exactly the partitions that v
// assigns it, with no claim or release pending.
func (s *session) settled(v View) bool {
	if _, ok := v.servers[s.me]; !ok || v.serversRev < s.regRev || len(s.pending) > 0 {
		return false
	}
	assigned := Assign(s.m.cfg.Partitions, slices.Collect(maps.Keys(v.servers)))
	for p := range int32(s.m.cfg.Partitions) {
		_, owned := s.owned[p]
		if owned != (assigned[p] == s.me) {
			return false
		}
	}
	return true
}

// lose stops writing partition p.
func (s *session) lose(p int32, why string) {
	s.m.cfg.Owner.Lose(p)
	epoch := s.owned[p]
	delete(s.owned, p)
	s.m.setOwned(s.owned)
	s.m.logger.Debug("topology: lost partition", "partition", p, "epoch", epoch, "why", why)
}

// loseAll stops writing every owned partition.
func (s *session) loseAll() {
	s.m.settled.Store(false)
	for _, p := range slices.Sorted(maps.Keys(s.owned)) {
		s.lose(p, "session ended")
	}
}

// drain waits for the claims in flight, after the session's context was
// cancelled, and stops writing any that was Acquired meanwhile. Their keys
// go with the lease.
func (s *session) drain() {
	s.claims.Wait()
	for {
		select {
		case r := <-s.results:
			if r.acquired {
				s.m.cfg.Owner.Lose(r.p)
			}
		default:
			return
		}
	}
}

func (s *session) startClaim(ctx context.Context, p int32) {
	s.pending[p] = true
	s.claims.Add(1)
	go func() {
		defer s.claims.Done()
		s.results <- s.claim(ctx, p)
	}()
}

// claim creates partition p's key and Acquires the partition at its epoch.
// It runs on its own goroutine and touches no session state.
func (s *session) claim(ctx context.Context, p int32) claimResult {
	key := partitionKey(p)
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	// Create the key only if it does not exist: CreateRevision is 0 exactly
	// when the key is absent, so of members claiming at once exactly one
	// succeeds. Otherwise read the key, to wait for the view to show it.
	resp, err := s.m.cfg.Client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, s.me, clientv3.WithLease(s.lease.id))).
		Else(clientv3.OpGet(key)).
		Commit()
	cancel()
	if err != nil {
		return claimResult{p: p, err: fmt.Errorf("claim: %w", err)}
	}
	if !resp.Succeeded {
		r := claimResult{p: p}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			r.rev = kvs[0].ModRevision
		}
		return r
	}
	// The Txn created the key, so its CreateRevision, the epoch, is the
	// Txn's revision.
	epoch := resp.Header.Revision
	actx, cancel := context.WithTimeout(ctx, acquireTimeout)
	err = s.m.cfg.Owner.Acquire(actx, p, epoch)
	cancel()
	if err == nil {
		return claimResult{p: p, epoch: epoch, rev: epoch, acquired: true}
	}
	r := claimResult{p: p, epoch: epoch, rev: epoch, err: fmt.Errorf("acquire at epoch %d: %w", epoch, err)}
	// Undo the claim, so the partition does not sit with an owner that
	// does not write it. If this fails too, converge deletes the key.
	if rev, rerr := s.release(ctx, p, epoch); rerr == nil {
		r.rev = max(r.rev, rev)
	}
	return r
}

// finish records a claim's result.
func (s *session) finish(r claimResult) {
	delete(s.pending, r.p)
	s.seenRev[r.p] = max(s.seenRev[r.p], r.rev)
	switch {
	case r.acquired:
		s.owned[r.p] = r.epoch
		s.failures[r.p] = 0
		s.m.setOwned(s.owned)
		s.m.logger.Debug("topology: acquired partition", "partition", r.p, "epoch", r.epoch)
	case r.err != nil:
		s.failures[r.p]++
		d := backoff(s.failures[r.p], claimRetryBackoffMin, claimRetryBackoffMax)
		s.retryAt[r.p] = time.Now().Add(d)
		s.m.logger.Warn("topology: claim failed", "partition", r.p, "err", r.err, "retry_in", d)
	}
}

// release deletes partition p's key if it is still the one created at
// epoch. It returns the deletion's revision, or 0 if there was nothing to
// delete.
func (s *session) release(ctx context.Context, p int32, epoch int64) (int64, error) {
	key := partitionKey(p)
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// Compare the CreateRevision, not the value: once the key is gone and
	// created again, even by this same server, it is a newer claim with a
	// larger epoch and must stay.
	resp, err := s.m.cfg.Client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", epoch)).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("release partition %d: %w", p, err)
	}
	if !resp.Succeeded {
		return 0, nil
	}
	return resp.Header.Revision, nil
}

// release is a partition key to delete, by the epoch it was created at.
type release struct {
	p     int32
	epoch int64
}

// releaseAll deletes the keys rs, claimsInFlightMax at a time (a hand-over
// after a join moves about 1/n of all partitions). It reports whether
// every release succeeded.
func (s *session) releaseAll(ctx context.Context, rs []release) bool {
	if len(rs) == 0 {
		return true
	}
	revs := make([]int64, len(rs))
	errs := make([]error, len(rs))
	sem := make(chan struct{}, claimsInFlightMax)
	var wg sync.WaitGroup
	for i, r := range rs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			revs[i], errs[i] = s.release(ctx, r.p, r.epoch)
		})
	}
	wg.Wait()
	ok := true
	for i, r := range rs {
		if errs[i] != nil {
			ok = false
			s.m.logger.Warn("topology: release failed", "partition", r.p, "err", errs[i])
			continue
		}
		s.seenRev[r.p] = max(s.seenRev[r.p], revs[i])
	}
	return ok
}
