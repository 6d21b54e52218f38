package topology

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/stock"
)

// movesPrefix holds one key per SKU being moved, bound to the mover's
// lease: present only while the SKU is being moved, so idle SKUs cost no
// key. The value is the holder; the key's CreateRevision is the fencing
// token.
const movesPrefix = "/shardstock/moves/"

func moveKey(sku string) string { return movesPrefix + sku }

// MoveLeases hands out one process's rebalance leases, one per SKU, all
// bound to one etcd lease of the process (granted on first use and again
// after it is lost). A lease is held by at most one holder in the cluster:
// it is the mover's right to plan and create transfers for the SKU, and its
// token, recorded on each transfer, lets the shard writers refuse the moves
// of a holder that lost it (internal/postgres move fences).
type MoveLeases struct {
	client *clientv3.Client
	holder string
	ttl    time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	lease  *lease
	cancel context.CancelFunc // stops lease's keep-alive
	closed bool
}

// MoveLease is one SKU's rebalance lease, held.
type MoveLease struct {
	stock.MoveLease
	key  string
	lost <-chan struct{}
	m    *MoveLeases
}

// Lost is closed once the process's etcd lease may have expired, and with
// it this lease: the holder must stop creating and stepping transfers (the
// writers refuse them anyway once a newer holder raised the fence).
func (l *MoveLease) Lost() <-chan struct{} { return l.lost }

// Release deletes the lease's key if it is still this holding's.
func (l *MoveLease) Release(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	_, err := l.m.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.Token)).
		Then(clientv3.OpDelete(l.key)).Commit()
	return err
}

// NewMoveLeases returns the move leases of holder (the allocator's id),
// bound to an etcd lease of ttl (0: leaseTTLDefault).
func NewMoveLeases(client *clientv3.Client, holder string, ttl time.Duration, log *slog.Logger) *MoveLeases {
	if ttl == 0 {
		ttl = leaseTTLDefault
	}
	if log == nil {
		log = slog.Default()
	}
	return &MoveLeases{client: client, holder: holder, ttl: ttl, log: log}
}

// Holder is the id this process holds leases under.
func (m *MoveLeases) Holder() string { return m.holder }

// processLease returns the process's live etcd lease, granting a new one
// when there is none or the last was lost.
func (m *MoveLeases) processLease(ctx context.Context) (*lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("topology: move leases closed")
	}
	if m.lease != nil {
		select {
		case <-m.lease.Lost():
			m.cancel()
			m.lease = nil
		default:
			return m.lease, nil
		}
	}
	l, err := grantLease(ctx, m.client, m.ttl)
	if err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	go l.keepAlive(kctx, m.log)
	m.lease, m.cancel = l, cancel
	return l, nil
}

// TryAcquire takes sku's lease if no one holds it; else it answers
// REBALANCE_IN_PROGRESS naming the holder.
func (m *MoveLeases) TryAcquire(ctx context.Context, sku string) (*MoveLease, error) {
	got, holder, _, err := m.try(ctx, moveKey(sku), sku)
	if err != nil || got != nil {
		return got, err
	}
	return nil, stock.Errorf(stock.CodeRebalanceInProgress, "%s is being moved by %s; retry later", sku, holder)
}

// Acquire takes sku's lease, waiting while someone else holds it, until ctx
// ends.
func (m *MoveLeases) Acquire(ctx context.Context, sku string) (*MoveLease, error) {
	for {
		got, _, rev, err := m.try(ctx, moveKey(sku), sku)
		if err != nil || got != nil {
			return got, err
		}
		if err := m.waitDeleted(ctx, sku, rev); err != nil {
			return nil, err
		}
	}
}

// try takes the lease of key (sku's, or "" for another than a SKU's) if
// key is absent; else it returns the holder and the revision at which it
// looked.
func (m *MoveLeases) try(ctx context.Context, key, sku string) (got *MoveLease, holder string, rev int64, err error) {
	l, err := m.processLease(ctx)
	if err != nil {
		return nil, "", 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, m.holder, clientv3.WithLease(l.id))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, "", 0, fmt.Errorf("topology: take the lease %s: %w", key, err)
	}
	if resp.Succeeded {
		return &MoveLease{MoveLease: stock.MoveLease{SKU: sku, Holder: m.holder, Token: resp.Header.Revision}, key: key, lost: l.Lost(), m: m}, "", 0, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		holder = string(kvs[0].Value)
	}
	return nil, holder, resp.Header.Revision, nil
}

// waitDeleted returns once sku's lease key is deleted after rev (or was
// already), or ctx ends.
func (m *MoveLeases) waitDeleted(ctx context.Context, sku string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range m.client.Watch(wctx, moveKey(sku), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("topology: watch of the move lease of %s ended", sku)
}

// List returns every move lease held now, in the cluster, by SKU.
func (m *MoveLeases) List(ctx context.Context) ([]stock.MoveLease, error) {
	return ListMoveLeases(ctx, m.client)
}

// ListMoveLeases returns every move lease held now, by SKU.
func ListMoveLeases(ctx context.Context, client *clientv3.Client) ([]stock.MoveLease, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := client.Get(rctx, movesPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("topology: list move leases: %w", err)
	}
	out := make([]stock.MoveLease, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		sku, _ := strings.CutPrefix(string(kv.Key), movesPrefix)
		out = append(out, stock.MoveLease{SKU: sku, Holder: string(kv.Value), Token: kv.CreateRevision})
	}
	return out, nil
}

// Close revokes the process's lease, releasing every move lease it holds.
func (m *MoveLeases) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.lease == nil {
		return
	}
	m.cancel()
	if err := m.lease.revoke(context.Background()); err != nil {
		m.log.Warn("topology: revoke the move lease", "err", err)
	}
	m.lease = nil
}
