package topology

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/pause"
)

// The sold-out marks. docs/soldout.md argues why an allocator that
// answers from a mark is exact; the comments here say which step each
// piece of it is.
const (
	// soldOutPrefix holds one key per SKU ever marked: "soldout" while it
	// is marked, "open" once a reopen took the mark away. Every reopen
	// writes it, so its ModRevision changes with every reopen: a marker
	// that read it before its database check marks only if it did not
	// change since (the reopen fence).
	soldOutPrefix = "/shardstock/soldout/"
	// reopenPrefix holds one key per reopen not known to be over
	// (/shardstock/reopen/<sku>/<idempotency key>): the request that
	// brings stock back, so that a reopen whose allocator died, or whose
	// request is in doubt, can be finished by another one.
	reopenPrefix = "/shardstock/reopen/"

	markedValue = "soldout"
	openValue   = "open"

	// SoldOutFreshMax is how long an allocator trusts its marks after the
	// last moment it knew it had every change to them (a progress answer
	// on its watch). A reopen waits this long (and reopenMargin) after it
	// took the mark away before any stock comes back, so that no
	// allocator still answers from the mark by then, whatever its watch's
	// delay: the reopen's wait is a replenish's extra latency.
	SoldOutFreshMax = 500 * time.Millisecond
	// reopenMargin covers two machines' clocks running at slightly
	// different rates over SoldOutFreshMax.
	reopenMargin = 50 * time.Millisecond
	// progressInterval is how often the watch is asked for a progress
	// answer while the marks are read; well under SoldOutFreshMax, so that
	// marks stay trusted.
	progressInterval = 100 * time.Millisecond
	// progressIdleTicks is how many progress intervals without a read of
	// the marks (Marked) stop the progress requests: an allocator without
	// requests trusts no mark (it needs none) and asks etcd nothing; the
	// next read asks at once (the marks are trusted again one etcd round
	// trip later; that read itself goes the usual way).
	progressIdleTicks = 10
	// marksMax bounds the marks a process keeps (a SKU name and a revision
	// each: about 100 bytes, 100 MB at most); a SKU marked beyond it is
	// not answered from memory here, which is never wrong.
	marksMax = 1 << 20
	// pendingListed bounds the reopens one Look returns for settling.
	pendingListed = 16
)

func soldOutKey(sku string) string { return soldOutPrefix + sku }

// reopenKeys is the prefix of sku's reopens: a SKU name holds no '/', so
// no other SKU's keys share it.
func reopenKeys(sku string) string { return reopenPrefix + sku + "/" }

// SoldOut follows every SKU's sold-out mark in etcd and writes them. An
// allocator answers a new key of a marked SKU without asking anyone
// (Marked); it marks a SKU its database check found sold out for good
// (Look, then Mark) and takes the mark away before stock comes back
// (Reopen). Run keeps the view.
type SoldOut struct {
	client *clientv3.Client
	log    *slog.Logger
	base   time.Time // monotonic origin of confirmed

	mu     sync.RWMutex
	marked map[string]int64 // SKU -> ModRevision of its "soldout" value
	// confirmed is when (nanoseconds since base) the last answered progress
	// request was sent: every change to the marks before then is in marked.
	// 0: not known (before the first answer, or after the watch broke).
	confirmed atomic.Int64
	// read is set by Marked and cleared by each progress tick; asking is
	// whether the watch asks for progress answers (cleared once no read
	// came for progressIdleTicks); wake is how a read restarts it.
	read, asking atomic.Bool
	wake         chan struct{}
	asked        atomic.Int64 // progress requests sent, for tests
}

// NewSoldOut returns the sold-out marks over client; call Run.
func NewSoldOut(client *clientv3.Client, log *slog.Logger) *SoldOut {
	if log == nil {
		log = slog.Default()
	}
	s := &SoldOut{client: client, log: log, base: time.Now(), marked: map[string]int64{}, wake: make(chan struct{}, 1)}
	s.asking.Store(true)
	return s
}

// Marked returns the revision of sku's mark, if it is marked and the view
// is fresh: its last progress answer confirmed every change up to a
// moment less than SoldOutFreshMax ago. Any reopen since that moment
// still waits until after the mark stops being trusted here.
func (s *SoldOut) Marked(sku string) (int64, bool) {
	// read before asking (the watch clears asking before read): either
	// the watch sees this read or this read sees it stopped and wakes it.
	if !s.read.Load() {
		s.read.Store(true)
	}
	if !s.asking.Load() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	c := s.confirmed.Load()
	if c == 0 || time.Since(s.base)-time.Duration(c) >= SoldOutFreshMax {
		return 0, false
	}
	s.mu.RLock()
	rev, ok := s.marked[sku]
	s.mu.RUnlock()
	return rev, ok
}

// Run follows the marks until ctx ends: it loads them, watches them from
// the revision it loaded, and asks for a progress answer every
// progressInterval. A broken watch (compaction, lost connection) makes
// every mark untrusted until it is loaded again.
func (s *SoldOut) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := s.follow(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("sold-out marks: watch broken; loading them again", "err", err)
			if !pause.For(ctx, progressInterval) {
				break
			}
		}
	}
	s.confirmed.Store(0)
	return nil
}

// follow is one load and watch of the marks.
func (s *SoldOut) follow(ctx context.Context) error {
	s.confirmed.Store(0)
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := s.client.Get(rctx, soldOutPrefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("topology: load sold-out marks: %w", err)
	}
	marked := map[string]int64{}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == markedValue && len(marked) < marksMax {
			marked[strings.TrimPrefix(string(kv.Key), soldOutPrefix)] = kv.ModRevision
		}
	}
	s.mu.Lock()
	s.marked = marked
	s.mu.Unlock()
	// A watcher of its own: its progress requests and answers are on a
	// stream no other watch shares.
	w := clientv3.NewWatcher(s.client)
	defer w.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	// From the loaded revision itself, not the next: etcd answers a
	// progress request only once the store has reached every watcher's
	// start, so a watch from the next revision would go unanswered (and
	// the marks untrusted) until some other write. The events of the
	// loaded revision come again; applying them again changes nothing.
	ch := w.Watch(wctx, soldOutPrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	s.asking.Store(true)
	ticks := tick.C         // nil while no one reads the marks
	idle := 0               // progress ticks without a read
	var asked time.Duration // when the oldest unanswered progress request was sent; 0: none
	ask := func() {
		now := time.Since(s.base)
		s.asked.Add(1)
		if err := w.RequestProgress(wctx); err != nil {
			s.log.Debug("sold-out marks: progress request failed", "err", err)
			return
		}
		if asked == 0 {
			asked = now
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
			if ticks == nil {
				s.asking.Store(true)
				tick.Reset(progressInterval)
				ticks, idle = tick.C, 0
				ask()
			}
		case <-ticks:
			if s.read.Swap(false) {
				idle = 0
			} else if idle++; idle >= progressIdleTicks {
				s.asking.Store(false)
				if !s.read.Swap(false) { // no read came before asking was cleared
					tick.Stop()
					ticks = nil
					continue
				}
				s.asking.Store(true)
				idle = 0
			}
			ask()
		case wr, ok := <-ch:
			if !ok {
				return fmt.Errorf("topology: sold-out watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if wr.IsProgressNotify() {
				// Every event before the answer has been delivered, and the
				// answer came after a request sent at asked (an answer
				// received with none asked is of a request already counted).
				if asked != 0 {
					s.confirmed.Store(int64(asked))
					asked = 0
				}
				continue
			}
			s.apply(wr.Events)
		}
	}
}

// apply records the changes of the marks in events.
func (s *SoldOut) apply(events []*clientv3.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range events {
		sku := strings.TrimPrefix(string(ev.Kv.Key), soldOutPrefix)
		if ev.Type == mvccpb.PUT && string(ev.Kv.Value) == markedValue {
			if _, ok := s.marked[sku]; ok || len(s.marked) < marksMax {
				s.marked[sku] = ev.Kv.ModRevision
			}
			continue
		}
		delete(s.marked, sku)
	}
}

// SoldOutLook is what a marker read of a SKU before its database check.
type SoldOutLook struct {
	SKU    string
	Marked bool  // already marked: nothing to do
	Rev    int64 // the mark key's ModRevision (0: absent)
	// Pending are reopens not known to be over: the SKU is not marked
	// until each is settled (Settle), whatever the database says.
	Pending []Reopen
}

// Reopen is one reopen not known to be over: its request, as the reopening
// allocator recorded it, and the key's revision.
type Reopen struct {
	Key     string
	Request []byte
	Rev     int64
}

// Look reads sku's mark and its pending reopens, in one revision. A
// marker calls it before it reads the database.
func (s *SoldOut) Look(ctx context.Context, sku string) (SoldOutLook, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := s.client.Txn(rctx).Then(
		clientv3.OpGet(soldOutKey(sku)),
		clientv3.OpGet(reopenKeys(sku), clientv3.WithPrefix(), clientv3.WithLimit(pendingListed)),
	).Commit()
	if err != nil {
		return SoldOutLook{}, fmt.Errorf("topology: look at the sold-out mark of %s: %w", sku, err)
	}
	l := SoldOutLook{SKU: sku}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		l.Rev, l.Marked = kvs[0].ModRevision, string(kvs[0].Value) == markedValue
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		l.Pending = append(l.Pending, Reopen{Key: string(kv.Key), Request: kv.Value, Rev: kv.ModRevision})
	}
	return l, nil
}

// Mark marks the SKU of l sold out, if no reopen wrote its mark key since
// l was read and none is pending: the marker's database check, made after
// l, then saw every unit any reopen before it brought back. It reports
// whether it marked.
func (s *SoldOut) Mark(ctx context.Context, l SoldOutLook) (bool, error) {
	if l.Marked || len(l.Pending) > 0 {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	key := soldOutKey(l.SKU)
	resp, err := s.client.Txn(rctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", l.Rev),
			clientv3.Compare(clientv3.CreateRevision(reopenKeys(l.SKU)).WithPrefix(), "=", 0)).
		Then(clientv3.OpPut(key, markedValue)).Commit()
	if err != nil {
		return false, fmt.Errorf("topology: mark %s sold out: %w", l.SKU, err)
	}
	return resp.Succeeded, nil
}

// Reopening is a reopen under way: its record, and how long to wait before
// the request that brings stock back may be sent.
type Reopening struct {
	Wait time.Duration
	key  string
	rev  int64
	s    *SoldOut
}

// Reopen takes sku's mark away before a request (record, keyed by key)
// brings stock back: in one transaction it records the request under
// reopenPrefix and writes "open" on the mark key (a new ModRevision: a
// marker that read the key before fails its Mark). Wait is
// SoldOutFreshMax and reopenMargin if the SKU was marked, or another
// reopen is pending (it may have taken a mark away a moment ago), else 0:
// no allocator can still trust a mark of sku after it.
func (s *SoldOut) Reopen(ctx context.Context, sku, key string, record []byte) (*Reopening, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	rkey := reopenKeys(sku) + key
	resp, err := s.client.Txn(rctx).Then(
		clientv3.OpGet(soldOutKey(sku)),
		clientv3.OpGet(reopenKeys(sku), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpPut(rkey, string(record)),
		clientv3.OpPut(soldOutKey(sku), openValue),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("topology: reopen %s: %w", sku, err)
	}
	r := &Reopening{key: rkey, rev: resp.Header.Revision, s: s}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	wasMarked := len(kvs) > 0 && string(kvs[0].Value) == markedValue
	if wasMarked || resp.Responses[1].GetResponseRange().Count > 0 {
		r.Wait = SoldOutFreshMax + reopenMargin
	}
	return r, nil
}

// Done removes the reopen's record: its request is applied, replayed or
// refused with no copy left in doubt. A record a newer reopen of the same
// key wrote stays.
func (r *Reopening) Done(ctx context.Context) error {
	return r.s.Settle(ctx, Reopen{Key: r.key, Rev: r.rev})
}

// Settle removes a pending reopen's record if it is unchanged since p was
// read.
func (s *SoldOut) Settle(ctx context.Context, p Reopen) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	_, err := s.client.Txn(rctx).
		If(clientv3.Compare(clientv3.ModRevision(p.Key), "=", p.Rev)).
		Then(clientv3.OpDelete(p.Key)).Commit()
	return err
}
