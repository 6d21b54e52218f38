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
	cur stock.Placement
	rev int64 // the key's ModRevision for cur

	sessMu sync.Mutex
	sess   *concurrency.Session // for the lock, kept while it lives
}

// LoadPlacements reads the placement, creating its first version over
// databases (sorted as given) if there is none yet: the first process to
// start decides, and every later one reads its decision.
func LoadPlacements(ctx context.Context, client *clientv3.Client, databases []string, log *slog.Logger) (*Placements, error) {
	if log == nil {
		log = slog.Default()
	}
	first, err := stock.Placement{}.Next(databases)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
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
		p.cur, p.rev = first, resp.Header.Revision
		log.Info("placement created", "version", first.Version(), "databases", databases)
		return p, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, errors.New("load placement: key vanished")
	}
	if err := p.set(kvs[0].Value, kvs[0].ModRevision); err != nil {
		return nil, err
	}
	return p, nil
}

// set decodes and takes val if it is newer than what p holds.
func (p *Placements) set(val []byte, rev int64) error {
	var pl stock.Placement
	if err := json.Unmarshal(val, &pl); err != nil {
		return fmt.Errorf("placement at revision %d: %w", rev, err)
	}
	if err := pl.Check(); err != nil {
		return fmt.Errorf("placement at revision %d: %w", rev, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if rev > p.rev {
		p.cur, p.rev = pl, rev
	}
	return nil
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
		from := p.rev + 1
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
		if !sleep(ctx, backoff(failures, placementWatchRetryMin, placementWatchRetryMax)) {
			return
		}
		if err := p.refresh(ctx); err != nil {
			p.log.Warn("placement read", "err", err)
		}
	}
}

// refresh reads the key (linearizably) into Current.
func (p *Placements) refresh(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.client.Get(rctx, placementKey)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return errors.New("placement key missing")
	}
	return p.set(resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
}

// Locked runs f holding the placement lock, with the placement as of the
// moment the lock was taken. CreateSku runs under it; Publish takes it.
// The lock's session (an etcd lease of placementLockTTL) is kept between
// calls, so a lock costs a few round trips, not a lease each.
func (p *Placements) Locked(ctx context.Context, f func(stock.Placement) error) error {
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
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		if err := mu.Unlock(uctx); err != nil {
			p.log.Warn("placement unlock", "err", err)
		}
	}()
	if err := p.refresh(ctx); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	return f(p.Current())
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

// Publish adds a version that spreads new SKUs over databases (existing
// SKUs stay where they are) and returns the new placement.
func (p *Placements) Publish(ctx context.Context, databases []string) (stock.Placement, error) {
	var out stock.Placement
	err := p.Locked(ctx, func(cur stock.Placement) error {
		next, err := cur.Next(databases)
		if err != nil {
			return err
		}
		val, err := json.Marshal(next)
		if err != nil {
			return err
		}
		p.mu.Lock()
		rev := p.rev
		p.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		resp, err := p.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(placementKey), "=", rev)).
			Then(clientv3.OpPut(placementKey, string(val))).Commit()
		if err != nil {
			return fmt.Errorf("publish placement: %w", err)
		}
		if !resp.Succeeded {
			return errors.New("publish placement: changed meanwhile")
		}
		if err := p.set(val, resp.Header.Revision); err != nil {
			return err
		}
		out = next
		return nil
	})
	return out, err
}
