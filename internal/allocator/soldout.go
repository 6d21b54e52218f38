package allocator

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/keyset"
	"github.com/shardstock/shardstock/internal/pause"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// Bounds of the sold-out answered from memory (docs/soldout.md).
const (
	// soldOutKeysMax bounds the keys kept of one marked SKU: 8 bytes each,
	// 8 MiB. A SKU with more operations is not answered from memory (its
	// refusals cost a sold-out check each, as without marks).
	soldOutKeysMax = 1 << 20
	// soldOutKeysTotalMax bounds the keys kept of every marked SKU
	// together (32 MiB); the least recently used SKU's go first, and are
	// read again, once, when it is next asked for.
	soldOutKeysTotalMax = 1 << 22
	// soldOutSKUsMax bounds the marked SKUs whose keys are kept.
	soldOutSKUsMax = 1 << 14
	// markInterval is the least time between two markings of one SKU by
	// one allocator: a sell-out storm's checks ask for one marking, not
	// one each.
	markInterval = 250 * time.Millisecond
	// markingsMax bounds the SKUs being marked, or having their keys
	// read, at once (each a goroutine and a query).
	markingsMax = 64
	// markTimeout bounds one marking, settling included.
	markTimeout = 10 * time.Second
)

// memory is what answers a marked SKU's new keys: the marks (etcd) and,
// per marked SKU, the keys of every operation recorded before its mark.
type memory struct {
	marks *topology.SoldOut // nil: never answer from memory
	keys  *keyset.Sets

	mu   sync.Mutex
	busy map[string]time.Time // jobs running ("mark" or "keys", NUL, SKU), since
}

func (m *memory) init(marks *topology.SoldOut) {
	m.marks, m.keys = marks, keyset.New(soldOutSKUsMax, soldOutKeysTotalMax)
	m.busy = map[string]time.Time{}
}

// fromMemory answers a reserve or deduct of a SKU marked sold out for good
// whose key no operation of the SKU holds: the refusal the sold-out check
// would give, with no query and no call to a shard. A key whose hash is
// among the SKU's operations' (a replay, or a rare collision) goes the
// usual way, and so gets its first result. ok is false when the answer is
// not known here.
func (a *Allocator) fromMemory(r *stock.Request, sku *stock.SKU) (res stock.Result, ok bool) {
	m := &a.memory
	if m.marks == nil {
		return stock.Result{}, false
	}
	rev, marked := m.marks.Marked(sku.Name)
	if !marked {
		return stock.Result{}, false
	}
	if !a.OperationKeyNew(sku.Name, rev, r.Key) {
		return stock.Result{}, false
	}
	a.metrics.memoryRefusals.Inc()
	return refusal(r, sku), true
}

// OperationKeyNew reports whether this process's set of sku's operation
// keys, read under the mark rev, lacks key; false while the set is not
// there (it is then read in the background) or no marks are kept.
func (a *Allocator) OperationKeyNew(sku string, rev int64, key string) bool {
	m := &a.memory
	if m.marks == nil {
		return false
	}
	ks := m.keys.Get(sku)
	if ks == nil || ks.Rev != rev {
		a.readKeys(sku, rev)
		return false
	}
	return ks.New(m.keys, key)
}

// refusal is the answer to a request with a new key when the SKU holds
// less than it asks: the SKU's most specific refusal, or OUT_OF_STOCK.
func refusal(r *stock.Request, sku *stock.SKU) stock.Result {
	if err := sku.Refuse(r, 0, time.Time{}); err != nil {
		return stock.Result{Err: err}
	}
	return stock.Result{Err: stock.Errorf(stock.CodeOutOfStock, "not enough stock of %s", r.Shard.SKU)}
}

// start reserves job (a SKU's marking, or its key read) for one run in
// the background: at most one at a time, at most markingsMax at once.
func (m *memory) start(job string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.busy[job]; ok || len(m.busy) >= markingsMax {
		return false
	}
	m.busy[job] = time.Now()
	return true
}

// finish ends start's reservation, at least least after it began.
func (m *memory) finish(job string, least time.Duration) {
	m.mu.Lock()
	began := m.busy[job]
	m.mu.Unlock()
	if wait := least - time.Since(began); wait > 0 {
		time.Sleep(wait)
	}
	m.mu.Lock()
	delete(m.busy, job)
	m.mu.Unlock()
}

// readKeys reads, in the background, the keys of every operation of a SKU
// whose mark (rev) this allocator saw. The read starts after the mark was
// seen, hence after the marker's check: it has every key recorded before
// the SKU sold out for good, and no key can be recorded after it until a
// reopen, which takes the mark away first.
func (a *Allocator) readKeys(sku string, rev int64) {
	m := &a.memory
	job := "keys\x00" + sku
	if !m.start(job) {
		return
	}
	go func() {
		defer m.finish(job, 0)
		ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
		defer cancel()
		hashes := []uint64{}
		n, err := a.db.OperationKeys(ctx, sku, soldOutKeysMax, func(k string) { hashes = append(hashes, m.keys.Hash(k)) })
		if err != nil {
			a.log.Debug("sold-out keys not read", "sku", sku, "err", err)
			return
		}
		m.keys.Put(sku, rev, hashes, n > soldOutKeysMax)
	}()
}

// Availability reads sku's shards and its stock in transit in one snapshot,
// as the sold-out check does: the units available, and whether the SKU is
// sold out for good (soldOutForGood). The admission worker polls it.
func (a *Allocator) Availability(ctx context.Context, sku string) (available int64, soldOut bool, err error) {
	rows, inTransit, _, err := a.db.SoldOutCheck(ctx, sku, nil)
	if err != nil {
		return 0, false, err
	}
	for _, r := range rows {
		available += r.Available
	}
	gone := soldOutForGood(rows, inTransit)
	if gone {
		// A SKU under admission refused only by RequestToken makes no
		// sold-out check of Allocate's: its marking starts here.
		a.markSoon(sku)
	}
	return available, gone, nil
}

// SoldOutMark reports whether this allocator's view of the marks, fresh,
// marks sku sold out for good, and at which revision: the admission
// service answers RequestToken from memory under it.
func (a *Allocator) SoldOutMark(sku string) (rev int64, marked bool) {
	if a.memory.marks == nil {
		return 0, false
	}
	return a.memory.marks.Marked(sku)
}

// soldOutForGood reports whether a SKU's shards and transfers, read in
// one snapshot, hold nothing: no unit available, held or in transit. Only
// a reopen (a replenish, a positive adjustment) brings stock back then.
func soldOutForGood(rows []stock.ShardRow, inTransit int64) bool {
	if inTransit != 0 || len(rows) == 0 {
		return false
	}
	for _, r := range rows {
		if r.Available != 0 || r.Reserved != 0 {
			return false
		}
	}
	return true
}

// markSoon marks sku sold out in the background (mark), unless it is
// marked already or being marked.
func (a *Allocator) markSoon(sku string) {
	m := &a.memory
	if m.marks == nil {
		return
	}
	job := "mark\x00" + sku
	if _, ok := m.marks.Marked(sku); ok || !m.start(job) {
		return
	}
	go func() {
		defer m.finish(job, markInterval)
		ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
		defer cancel()
		a.mark(ctx, sku)
	}()
}

// mark marks sku sold out if it is sold out for good: it reads the mark
// key and the SKU's pending reopens (Look), then the database; it marks
// only if no reopen wrote the mark key since the Look (Mark compares its
// revision). Pending reopens are settled instead, and the next check
// marks.
func (a *Allocator) mark(ctx context.Context, sku string) {
	l, err := a.memory.marks.Look(ctx, sku)
	if err != nil || l.Marked {
		return
	}
	if len(l.Pending) > 0 {
		a.settleReopens(ctx, l.Pending)
		return
	}
	rows, inTransit, _, err := a.db.SoldOutCheck(ctx, sku, nil)
	if err != nil || !soldOutForGood(rows, inTransit) {
		return
	}
	if ok, err := a.memory.marks.Mark(ctx, l); err != nil {
		a.log.Debug("sold-out mark failed", "sku", sku, "err", err)
	} else if ok {
		a.metrics.marks.Inc()
	}
}

// settleReopens finishes reopens whose allocator did not (it died, or its
// request is in doubt): each request is sent again, with its key, so a
// copy still in a shard's queue can no longer bring stock back later than
// this answer (a key is recorded once). It first waits as a reopen does:
// sending may apply the request now.
func (a *Allocator) settleReopens(ctx context.Context, pending []topology.Reopen) {
	if !pause.For(ctx, topology.SoldOutFreshMax) {
		return
	}
	for _, p := range pending {
		var r stock.Request
		if err := json.Unmarshal(p.Request, &r); err != nil || !reopens(&r) || stock.ValidateRequest(&r) != nil {
			a.log.Error("a pending reopen's record is not a replenish, a refund or a positive adjustment; left as it is", "key", p.Key, "err", err)
			continue
		}
		sku, err := a.sku(ctx, r.Shard.SKU)
		if err != nil {
			continue
		}
		if res, inDoubt := a.restock(ctx, &r, sku); res.Err == nil || res.Err.Code == stock.CodeIdempotencyKeyReused && !inDoubt {
			// Recorded, by this request or by another operation of its
			// key: no copy of it can apply any more.
			if err := a.memory.marks.Settle(ctx, p); err == nil {
				a.metrics.settledReopens.Inc()
			}
		}
	}
}

// reopens reports whether r brings stock back.
func reopens(r *stock.Request) bool {
	return r.Kind == stock.OpReplenish || r.Kind == stock.OpRefund || r.Kind == stock.OpAdjust && r.Quantity > 0
}

// restock sends r, which brings stock back: a refund to its sale's shard,
// a replenish or a positive adjustment to any shard (give).
func (a *Allocator) restock(ctx context.Context, r *stock.Request, sku *stock.SKU) (stock.Result, bool) {
	if r.Kind == stock.OpRefund {
		return a.sendRefund(ctx, r, sku)
	}
	return a.give(ctx, r, sku)
}

// reopen applies r, a replenish, a refund or a positive adjustment, after it has
// taken the SKU's mark away everywhere: it records r (so that another
// allocator can finish it), writes the mark key (a marker that read it
// before fails), and waits until no allocator can still trust the mark.
// The record goes once r's fate is sealed: applied, replayed, or refused
// with no shard in doubt.
func (a *Allocator) reopen(ctx context.Context, r *stock.Request, sku *stock.SKU) stock.Result {
	rec, err := json.Marshal(r)
	if err != nil {
		return stock.Result{Err: stock.Errorf(stock.CodeInternal, "could not record the request")}
	}
	ro, err := a.memory.marks.Reopen(ctx, sku.Name, r.Key, rec)
	if err != nil {
		a.log.Debug("reopen failed", "sku", sku.Name, "err", err)
		return unavailable("could not reopen %s; retry with the same key", sku.Name)
	}
	if ro.Wait > 0 {
		a.metrics.reopenWaits.Inc()
		if started := time.Now(); !pause.For(ctx, ro.Wait) {
			// Nothing was sent, but the record stays for the whole wait:
			// a reopen that finds it pending waits too, where one that
			// found nothing would send at once while the mark this one
			// took away may still be trusted.
			go func() {
				time.Sleep(ro.Wait - time.Since(started))
				a.endReopen(context.Background(), ro)
			}()
			return unavailable("deadline passed while %s reopened; retry with the same key", sku.Name)
		}
	}
	res, inDoubt := a.restock(ctx, r, sku)
	if res.Err == nil || !inDoubt {
		a.endReopen(ctx, ro)
	}
	return res
}

// endReopen removes a reopen's record; one left behind is settled by the
// next marking.
func (a *Allocator) endReopen(ctx context.Context, ro *topology.Reopening) {
	if err := ro.Done(ctx); err != nil {
		a.log.Debug("reopen record not removed", "err", err)
	}
}
