package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease renewal. A keep-alive is sent keepAlivesPerTTL times per TTL (one
// small RPC per server: cheap), so that several can fail before the lease
// is lost; the lease counts as lost a leaseMarginDivisor-th of a TTL before
// it could expire at the server, so that Lose runs while the server still
// holds the keys and no other member can have claimed them.
const (
	keepAlivesPerTTL   = 6
	leaseMarginDivisor = 6
)

// lease is an etcd lease with a conservative local expiry.
//
// concurrency.Session is not used: the client library moves its deadline
// forward when a keep-alive response arrives (receipt time + TTL) and
// checks it once a second, so a session can report the lease alive for
// over a second after the server expired it and another member claimed
// its partitions. Here the deadline is the time the keep-alive was sent
// plus the TTL: the server renewed the lease after that, so the server's
// expiry is never earlier than ours.
type lease struct {
	client *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration // as granted by the server

	lost     chan struct{} // closed once the lease may have expired
	loseOnce sync.Once
	timer    *time.Timer // closes lost at the local expiry minus the margin
}

// grantLease grants a lease of at least ttl (rounded up to whole seconds)
// and starts its expiry timer.
func grantLease(ctx context.Context, client *clientv3.Client, ttl time.Duration) (*lease, error) {
	seconds := int64((ttl + time.Second - 1) / time.Second)
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := client.Grant(rctx, seconds)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("topology: grant lease: %w", err)
	}
	// The server may raise the TTL to its minimum; resp.TTL is what it enforces.
	l := &lease{
		client: client,
		id:     resp.ID,
		ttl:    time.Duration(resp.TTL) * time.Second,
		lost:   make(chan struct{}),
	}
	l.timer = time.AfterFunc(untilLost(start, l.ttl), l.lose)
	return l, nil
}

// untilLost is how long from now the lease counts as lost, if the last
// successful renewal, sent at sent, left it ttl to live.
func untilLost(sent time.Time, ttl time.Duration) time.Duration {
	return time.Until(sent.Add(ttl - ttl/leaseMarginDivisor))
}

func (l *lease) lose() { l.loseOnce.Do(func() { close(l.lost) }) }

// Lost is closed once the lease may have expired at the server.
func (l *lease) Lost() <-chan struct{} { return l.lost }

// keepAlive renews the lease until ctx is done or the lease is lost. The
// expiry timer runs on its own, so a slow or hung keep-alive call cannot
// delay the loss past the margin.
func (l *lease) keepAlive(ctx context.Context, logger *slog.Logger) {
	defer l.timer.Stop()
	interval := l.ttl / keepAlivesPerTTL
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.lost:
			return
		case <-tick.C:
		}
		sent := time.Now()
		// One attempt per tick, bounded by the tick: a late answer is
		// worth less than the next attempt.
		kctx, cancel := context.WithTimeout(ctx, interval)
		resp, err := l.client.KeepAliveOnce(kctx, l.id)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// Expired or revoked at the server: nothing left to renew.
			l.lose()
			return
		case err != nil:
			if ctx.Err() == nil {
				logger.Warn("topology: lease keep-alive failed", "lease", int64(l.id), "err", err)
			}
			continue
		}
		// Reset reports false once the timer has fired: the lease is then
		// lost for good, however late this renewal succeeded.
		if !l.timer.Reset(untilLost(sent, time.Duration(resp.TTL)*time.Second)) {
			l.lose()
			return
		}
	}
}

// revoke deletes the lease and every key bound to it in one revision.
func (l *lease) revoke(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	_, err := l.client.Revoke(rctx, l.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}
