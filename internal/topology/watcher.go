package topology

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/pause"
)

// View is an immutable snapshot of the topology: registered servers and
// partition owners. Its methods are safe for concurrent use. The zero View
// is empty and never changes.
//
// Servers and partitions come from two watches, so each is complete up to
// its own revision and one may be a moment ahead of the other (a dead
// server's registration may vanish before its ownership keys, or after).
type View struct {
	partitions int
	// serversRev and partitionsRev are the revisions up to which the view
	// holds every change to servers and to partitions.
	serversRev    int64
	partitionsRev int64
	servers       map[string]Server
	owners        []ownerKey // by partition; epoch 0 means no key
	changed       chan struct{}
}

// ownerKey is one partition key: its value and CreateRevision.
type ownerKey struct {
	server string
	epoch  int64
}

// Partitions is the number of partitions the view covers.
func (v View) Partitions() int { return v.partitions }

// Revision is the etcd revision of the newest change in the view.
func (v View) Revision() int64 { return max(v.serversRev, v.partitionsRev) }

// Owner returns partition p's owner and epoch. ok is false unless p has an
// ownership key and its server is registered: a live owner that can be
// routed to.
func (v View) Owner(p int32) (server Server, epoch int64, ok bool) {
	if p < 0 || int(p) >= len(v.owners) || v.owners[p].epoch == 0 {
		return Server{}, 0, false
	}
	o := v.owners[p]
	s, ok := v.servers[o.server]
	if !ok {
		return Server{}, 0, false
	}
	return s, o.epoch, true
}

// Server returns the registered server id.
func (v View) Server(id string) (Server, bool) {
	s, ok := v.servers[id]
	return s, ok
}

// Servers returns the registered servers sorted by id.
func (v View) Servers() []Server {
	out := slices.Collect(maps.Values(v.servers))
	slices.SortFunc(out, func(a, b Server) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// AllOwned reports whether every partition has a live owner.
func (v View) AllOwned() bool {
	if v.partitions == 0 {
		return false
	}
	for p := range int32(v.partitions) {
		if _, _, ok := v.Owner(p); !ok {
			return false
		}
	}
	return true
}

// Changed is closed once a newer view replaces v. Take the view first and
// wait on its Changed, so that no change is missed in between.
func (v View) Changed() <-chan struct{} { return v.changed }

// Watcher follows the topology in etcd. It never writes.
type Watcher struct {
	client     *clientv3.Client
	partitions int
	logger     *slog.Logger

	mu   sync.Mutex
	view View
}

// NewWatcher returns a Watcher over partitions partitions. It sees nothing
// until Run has loaded the first view.
func NewWatcher(client *clientv3.Client, partitions int) *Watcher {
	return &Watcher{
		client:     client,
		partitions: partitions,
		logger:     slog.Default(),
		view:       View{partitions: partitions, changed: make(chan struct{})},
	}
}

// Snapshot returns the current view.
func (w *Watcher) Snapshot() View {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.view
}

// WaitReady waits until every partition has a live owner, or ctx is done.
func (w *Watcher) WaitReady(ctx context.Context) error {
	for {
		v := w.Snapshot()
		if v.AllOwned() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topology: wait ready: %w", ctx.Err())
		case <-v.Changed():
		}
	}
}

// Run keeps the view current until ctx is done, then returns nil; call it
// once, on its own goroutine. It loads
// both prefixes at one revision and watches from the next; on a watch error
// or compaction it loads again. It returns an error only after
// resyncRetriesMax consecutive failures (minutes without etcd).
func (w *Watcher) Run(ctx context.Context) error {
	if w.client == nil || w.partitions < 1 || w.partitions > partitionsMax {
		return fmt.Errorf("%w: watcher needs a client and 1..%d partitions", ErrInvalidConfig, partitionsMax)
	}
	failures := 0
	for {
		err := w.follow(ctx, func() { failures = 0 })
		if ctx.Err() != nil {
			return nil
		}
		failures++
		if failures > resyncRetriesMax {
			return fmt.Errorf("topology: watch: %d consecutive failures: %w", failures-1, err)
		}
		w.logger.Warn("topology: watch failed, loading again", "err", err, "failures", failures)
		if !pause.For(ctx, backoff(failures, resyncBackoffMin, resyncBackoffMax)) {
			return nil
		}
	}
}

// follow loads the topology and applies watch events until an error. It
// calls healthy once the watches are established.
func (w *Watcher) follow(ctx context.Context, healthy func()) error {
	// One Txn of two Gets reads servers and partitions at one revision, so
	// the first view is consistent and the watches can start right after it.
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := w.client.Txn(rctx).Then(
		clientv3.OpGet(serversPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(partitionsPrefix, clientv3.WithPrefix()),
	).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	st := newViewState(w.partitions, resp.Header.Revision)
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		st.put(w.logger, string(kv.Key), kv.Value, kv.CreateRevision)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		st.put(w.logger, string(kv.Key), kv.Value, kv.CreateRevision)
	}
	w.publish(st)

	// Watch from the revision after the load, so no change in between is
	// lost. RequireLeader makes a watch fail when its etcd member loses the
	// leader (a partition) instead of going quiet on a stale view.
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision + 1), clientv3.WithCreatedNotify()}
	servers := w.client.Watch(wctx, serversPrefix, opts...)
	partitions := w.client.Watch(wctx, partitionsPrefix, opts...)
	created := 0
	for {
		var wr clientv3.WatchResponse
		var ok bool
		var rev *int64 // the revision this watch advances
		select {
		case wr, ok = <-servers:
			rev = &st.serversRev
		case wr, ok = <-partitions:
			rev = &st.partitionsRev
		}
		if !ok {
			if err := ctx.Err(); err != nil {
				return err
			}
			return errors.New("watch closed")
		}
		if err := wr.Err(); err != nil {
			// Includes compaction past our revision: only a new load can
			// tell what was missed.
			return fmt.Errorf("watch: %w", err)
		}
		if wr.Created {
			if created++; created == 2 {
				healthy()
			}
			continue
		}
		if len(wr.Events) == 0 {
			continue
		}
		for _, ev := range wr.Events {
			switch ev.Type {
			case mvccpb.PUT:
				st.put(w.logger, string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision)
			case mvccpb.DELETE:
				st.delete(string(ev.Kv.Key))
			}
			*rev = max(*rev, ev.Kv.ModRevision)
		}
		w.publish(st)
	}
}

// publish replaces the view with a copy of st and signals the old one.
func (w *Watcher) publish(st *viewState) {
	v := View{
		partitions:    w.partitions,
		serversRev:    st.serversRev,
		partitionsRev: st.partitionsRev,
		servers:       maps.Clone(st.servers),
		owners:        slices.Clone(st.owners),
		changed:       make(chan struct{}),
	}
	w.mu.Lock()
	old := w.view.changed
	w.view = v
	w.mu.Unlock()
	close(old)
}

// viewState is the mutable topology that follow builds views from.
type viewState struct {
	partitions    int
	serversRev    int64
	partitionsRev int64
	servers       map[string]Server
	owners        []ownerKey
}

func newViewState(partitions int, revision int64) *viewState {
	return &viewState{
		partitions:    partitions,
		serversRev:    revision,
		partitionsRev: revision,
		servers:       make(map[string]Server),
		owners:        make([]ownerKey, partitions),
	}
}

// put applies one key's value. Keys and values it does not understand are
// logged and skipped: every reader skips the same ones, so every member
// still computes the same assignment.
func (st *viewState) put(logger *slog.Logger, key string, value []byte, createRevision int64) {
	if id, ok := parseServerKey(key); ok {
		var s Server
		if err := json.Unmarshal(value, &s); err != nil || s.ID != id {
			logger.Warn("topology: skipping bad server registration", "key", key, "value", string(value))
			delete(st.servers, id)
			return
		}
		st.servers[id] = s
		return
	}
	if p, ok := parsePartitionKey(key, st.partitions); ok {
		st.owners[p] = ownerKey{server: string(value), epoch: createRevision}
		return
	}
	logger.Debug("topology: skipping unknown key", "key", key)
}

func (st *viewState) delete(key string) {
	if id, ok := parseServerKey(key); ok {
		delete(st.servers, id)
		return
	}
	if p, ok := parsePartitionKey(key, st.partitions); ok {
		st.owners[p] = ownerKey{}
	}
}

// backoff is the delay before retry number attempt (from 1): doubling from
// lo, capped at hi, with jitter in its upper half so that members that
// failed together do not retry together.
func backoff(attempt int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
