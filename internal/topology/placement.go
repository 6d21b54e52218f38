package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardstock/shardstock/internal/pause"
	"github.com/shardstock/shardstock/internal/stock"
)

// The placement of SKUs on databases (stock.Placement) is one key: its
// value is the JSON of the placement, a few kilobytes per version whatever
// the number of SKUs. placementLockKey is the prefix of an etcd mutex that
// CreateSku and SetPlacement take, so that no SKU is created under a
// version while a newer one is published (two allocators would otherwise
// create one SKU in two databases).
const (
	placementKey     = "/shardstock/placement"
	placementLockKey = "/shardstock/locks/placement"
	// placementLockTTL bounds how long a dead holder keeps the lock.
	placementLockTTL = 10 * time.Second
	// placementWatchRetryMin and Max bound the backoff of a broken watch.
	placementWatchRetryMin = 100 * time.Millisecond
	placementWatchRetryMax = 5 * time.Second
)

// Placements reads, watches and publishes the placement.
type Placements struct {
	client *clientv3.Client
	log    *slog.Logger

	mu  sync.Mutex
	cur stock.Placement // the newest version seen, in etcd or recorded
	// keyRev is the key's ModRevision as last read or watched (0: the key
	// was missing); watches resume after it.
	keyRev int64

	sessMu sync.Mutex
	sess   *concurrency.Session // for the lock, kept while it lives

	// lockMu serializes this process's holders: etcd's mutex is per
	// session, and two Mutexes of one session share a key, so both
	// would hold the lock at once.
	lockMu sync.Mutex
	held   *concurrency.Mutex // the lock while Locked's f runs
}

// LoadPlacements reads the placement. If etcd has none, or an older one
// than recorded (the newest placement the databases recorded: etcd lost
// the key, or was restored from an older snapshot), it puts recorded back
// and says so in the log; only if neither has one does it create the
// first version over databases (sorted as given): the first process to
// start decides, and every later one reads its decision. A lower version
// is never taken over a newer one the databases recorded: SKUs placed by
// the newer version would be looked for in the wrong databases.
func LoadPlacements(ctx context.Context, client *clientv3.Client, databases []string, recorded stock.Placement, log *slog.Logger) (*Placements, error) {
	if log == nil {
		log = slog.Default()
	}
	first := recorded
	if first.Version() == 0 {
		var err error
		if first, err = (stock.Placement{}).Next(databases); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
	} else if err := first.Check(); err != nil {
		return nil, fmt.Errorf("recorded placement: %w", err)
	}
	val, err := json.Marshal(first)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(placementKey), "=", 0)).
		Then(clientv3.OpPut(placementKey, string(val))).
		Else(clientv3.OpGet(placementKey)).Commit()
	if err != nil {
		return nil, fmt.Errorf("load placement: %w", err)
	}
	p := &Placements{client: client, log: log}
	if resp.Succeeded {
		p.cur, p.keyRev = first, resp.Header.Revision
		if recorded.Version() > 0 {
			log.Warn("placement missing in etcd: restored the version the databases recorded", "version", first.Version())
		} else {
			log.Info("placement created", "version", first.Version(), "databases", databases)
		}
		return p, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, errors.New("load placement: key vanished")
	}
	if err := p.set(kvs[0].Value, kvs[0].ModRevision); err != nil {
		return nil, err
	}
	if recorded.Version() > p.Current().Version() {
		if err := p.restore(ctx, recorded); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// restore puts pl, newer than etcd's placement, back into etcd (unless the
// key changed since p read it: then the next read decides) and takes it.
func (p *Placements) restore(ctx context.Context, pl stock.Placement) error {
	val, err := json.Marshal(pl)
	if err != nil {
		return err
	}
	p.mu.Lock()
	had, keyRev := p.cur.Version(), p.keyRev
	p.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.client.Txn(rctx).
		If(clientv3.Compare(clientv3.ModRevision(placementKey), "=", keyRev)).
		Then(clientv3.OpPut(placementKey, string(val))).Commit()
	if err != nil {
		return fmt.Errorf("restore placement: %w", err)
	}
	p.take(pl)
	if resp.Succeeded {
		p.mu.Lock()
		p.keyRev = resp.Header.Revision
		p.mu.Unlock()
		p.log.Warn("placement in etcd older than the databases recorded: restored", "etcd_version", had, "restored_version", pl.Version())
	}
	return nil
}

// set decodes and takes val, the key's value at revision rev, if its
// version is newer than what p holds. Versions, not revisions, decide:
// after an etcd restore, revisions can go back while versions may not.
func (p *Placements) set(val []byte, rev int64) error {
	var pl stock.Placement
	if err := json.Unmarshal(val, &pl); err != nil {
		return fmt.Errorf("placement at revision %d: %w", rev, err)
	}
	if err := pl.Check(); err != nil {
		return fmt.Errorf("placement at revision %d: %w", rev, err)
	}
	p.mu.Lock()
	p.keyRev = rev
	p.mu.Unlock()
	if !p.take(pl) {
		p.log.Warn("placement in etcd older than this process's: kept the newer", "etcd_version", pl.Version(), "version", p.Current().Version())
	}
	return nil
}

// take makes pl current if it is at least as new as the current one, and
// reports whether it did.
func (p *Placements) take(pl stock.Placement) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl.Version() < p.cur.Version() {
		return false
	}
	p.cur = pl
	return true
}

// Current is the newest placement this process has seen.
func (p *Placements) Current() stock.Placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Watch keeps Current up to date until ctx ends.
func (p *Placements) Watch(ctx context.Context) {
	for failures := 0; ctx.Err() == nil; {
		p.mu.Lock()
		from := p.keyRev + 1
		p.mu.Unlock()
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range p.client.Watch(wctx, placementKey, clientv3.WithRev(from)) {
			if err := resp.Err(); err != nil {
				p.log.Warn("placement watch", "err", err)
				break
			}
			failures = 0
			for _, ev := range resp.Events {
				if ev.Kv != nil && len(ev.Kv.Value) > 0 {
					if err := p.set(ev.Kv.Value, ev.Kv.ModRevision); err != nil {
						p.log.Error("placement ignored", "err", err)
					}
				}
			}
		}
		cancel()
		failures++
		if !pause.For(ctx, backoff(failures, placementWatchRetryMin, placementWatchRetryMax)) {
			return
		}
		if _, err := p.refresh(ctx); err != nil {
			p.log.Warn("placement read", "err", err)
		}
	}
}

// refresh reads the key (linearizably) into Current and returns the
// version etcd has (0: the key is missing, which is no error: Current
// keeps the version this process had).
func (p *Placements) refresh(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.client.Get(rctx, placementKey)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		p.mu.Lock()
		p.keyRev = 0
		p.mu.Unlock()
		p.log.Warn("placement key missing in etcd", "version", p.Current().Version())
		return 0, nil
	}
	var pl stock.Placement
	_ = json.Unmarshal(resp.Kvs[0].Value, &pl) // set reports a bad value
	return pl.Version(), p.set(resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
}

// Locked runs f holding the placement lock, with the placement as of the
// moment the lock was taken and the lock's fencing token: the etcd
// revision at which this holder got the lock, larger than any earlier
// holder's. f shows the token to every database it relies on
// (internal/dbset), so that a holder whose lock is gone (its lease expired
// while it was paused) is refused there once a newer holder has shown its
// own. If etcd's placement is missing or older than the one this process
// holds, Locked puts this process's back first. CreateSku runs under it,
// and so does SetPlacement (which publishes with Put).
// The lock's session (an etcd lease of placementLockTTL) is kept between
// calls, so a lock costs a few round trips, not a lease each.
func (p *Placements) Locked(ctx context.Context, f func(stock.Placement, int64) error) error {
	p.lockMu.Lock()
	defer p.lockMu.Unlock()
	sess, err := p.session(ctx)
	if err != nil {
		return fmt.Errorf("placement lock: %w", err)
	}
	mu := concurrency.NewMutex(sess, placementLockKey)
	lctx, cancel := context.WithTimeout(ctx, placementLockTTL)
	defer cancel()
	if err := mu.Lock(lctx); err != nil {
		return fmt.Errorf("placement lock: %w", err)
	}
	defer func() {
		p.held = nil
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		if err := mu.Unlock(uctx); err != nil {
			p.log.Warn("placement unlock", "err", err)
		}
	}()
	p.held = mu
	// The header of the response that granted the lock: every later
	// holder is granted after this one's key is gone, at a later revision.
	fence := mu.Header().Revision
	inEtcd, err := p.refresh(ctx)
	if err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	if cur := p.Current(); inEtcd < cur.Version() {
		if err := p.Put(ctx, cur); err != nil {
			return err
		}
		p.log.Warn("placement in etcd missing or older than this process's: restored", "etcd_version", inEtcd, "restored_version", cur.Version())
	}
	return f(p.Current(), fence)
}

// Put writes next as the placement in etcd and takes it; only inside
// Locked's f, and only while the lock is still this holder's (a holder
// whose lock is gone writes nothing). internal/dbset records next in every
// database before it calls Put, so that etcd never has a version the
// databases could not give back.
func (p *Placements) Put(ctx context.Context, next stock.Placement) error {
	if err := next.Check(); err != nil {
		return err
	}
	if p.held == nil {
		return errors.New("placement: Put outside Locked")
	}
	val, err := json.Marshal(next)
	if err != nil {
		return err
	}
	p.mu.Lock()
	keyRev := p.keyRev
	p.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.client.Txn(rctx).
		If(p.held.IsOwner(), clientv3.Compare(clientv3.ModRevision(placementKey), "=", keyRev)).
		Then(clientv3.OpPut(placementKey, string(val))).Commit()
	if err != nil {
		return fmt.Errorf("put placement: %w", err)
	}
	if !resp.Succeeded {
		return errors.New("put placement: the lock was lost or the placement changed meanwhile")
	}
	p.mu.Lock()
	p.keyRev = resp.Header.Revision
	p.mu.Unlock()
	p.take(next)
	return nil
}

// session returns the lock's session, making a new one if there is none or
// the last one's lease is gone.
func (p *Placements) session(ctx context.Context) (*concurrency.Session, error) {
	p.sessMu.Lock()
	defer p.sessMu.Unlock()
	if p.sess != nil {
		select {
		case <-p.sess.Done():
			p.sess = nil
		default:
			return p.sess, nil
		}
	}
	sctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	sess, err := concurrency.NewSession(p.client, concurrency.WithTTL(int(placementLockTTL/time.Second)), concurrency.WithContext(context.WithoutCancel(sctx)))
	if err != nil {
		return nil, err
	}
	p.sess = sess
	return sess, nil
}

// Close ends the lock's session (its lease revoked).
func (p *Placements) Close() {
	p.sessMu.Lock()
	defer p.sessMu.Unlock()
	if p.sess != nil {
		p.sess.Close()
		p.sess = nil
	}
}
