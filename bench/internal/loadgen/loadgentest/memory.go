// Package loadgentest holds an in-process stock system for testing the load
// generator itself: an exact counter behind one mutex, with knobs that break
// it in the ways the correctness line must catch.
package loadgentest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/stock"
)

// Memory is a loadgen.Target kept in memory. Its zero value is an exact,
// idempotent stock system; the knobs make it wrong on purpose.
type Memory struct {
	// Oversell lets available fall to -Oversell.
	Oversell int64
	// IgnoreKeys applies every request, repeated keys included.
	IgnoreKeys bool
	// Hoard refuses as out of stock any request that would leave fewer than
	// Hoard units available (a false sold-out).
	Hoard int64
	// DropLedger stops writing ledger entries, so the ledger no longer sums.
	DropLedger bool
	// Flaky answers SHARD_UNAVAILABLE, changing nothing, to the first
	// attempt of every deduct and reserve key: a client must retry.
	Flaky bool
	// Latency is added to every request.
	Latency time.Duration
	// LoseEvery, when positive, answers every LoseEvery-th deduct, reserve
	// and commit that would apply as a success without applying it: an
	// acknowledged operation the system then lacks, as when a database
	// loses a commit it had confirmed.
	LoseEvery int64
	// HalfCommitEvery, when positive, makes every HalfCommitEvery-th
	// CommitOrder commit every line but the last, which stays held, and
	// answer a success: an order left half held.
	HalfCommitEvery int64
	// RefundTwice applies every refund twice, beyond its sale when it
	// refunds the whole line.
	RefundTwice bool

	mu           sync.Mutex
	skus         map[string]*memSKU
	reservations map[string]*memReservation
	tried        map[string]bool // keys seen, for Flaky
	applied      int64           // applications so far, for LoseEvery
	orders       memOrders
}

// lose reports whether to answer this application as a success without
// making it (LoseEvery). m.mu is held.
func (m *Memory) lose() bool {
	m.applied++
	return m.LoseEvery > 0 && m.applied%m.LoseEvery == 0
}

var _ loadgen.Target = (*Memory)(nil)

type memSKU struct {
	initial, available, reserved, sold int64
	ops                                map[string]memOp // by idempotency key
	ledger                             []memEntry
}

type memOp struct {
	kind          string
	qty           int64
	reservationID string
}

type memEntry struct {
	kind                     string
	key                      string // the operation's key; an end entry's reservation id
	reservationID            string // a reserve's
	original                 string // a refund's sale
	dAvail, dReserved, dSold int64
}

type memReservation struct {
	sku   string
	qty   int64
	state string
}

// Name is "memory".
func (m *Memory) Name() string { return "memory" }

// Setup creates the SKUs.
func (m *Memory) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.skus = make(map[string]*memSKU, len(skus))
	m.reservations = map[string]*memReservation{}
	m.tried = map[string]bool{}
	for _, s := range skus {
		m.skus[s.SKU] = &memSKU{initial: s.Stock, available: s.Stock, ops: map[string]memOp{}}
	}
	return nil
}

// wait sleeps for Latency, then tells the runner the request is sent.
func (m *Memory) wait(ctx context.Context) {
	if m.Latency > 0 {
		t := time.NewTimer(m.Latency)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// answer returns o unless the client gave up meanwhile: like a server that
// committed while the client stopped listening.
func answer(ctx context.Context, o loadgen.Outcome) loadgen.Outcome {
	loadgen.Sent(ctx)
	if e, ok := loadgen.ErrorFromContext(ctx); ok {
		return e
	}
	return o
}

// Deduct takes qty units.
func (m *Memory) Deduct(ctx context.Context, sku, key string, qty int64) loadgen.Outcome {
	_, o := m.take(ctx, "deduct", sku, key, qty)
	return o
}

// Reserve holds qty units.
func (m *Memory) Reserve(ctx context.Context, sku, key string, qty int64) (string, loadgen.Outcome) {
	return m.take(ctx, "reserve", sku, key, qty)
}

func (m *Memory) take(ctx context.Context, kind, sku, key string, qty int64) (string, loadgen.Outcome) {
	m.wait(ctx)
	if e, ok := loadgen.ErrorFromContext(ctx); ok {
		return "", e
	}
	m.mu.Lock()
	s, ok := m.skus[sku]
	if !ok {
		m.mu.Unlock()
		return "", loadgen.Error(string(stock.CodeSKUNotFound))
	}
	if m.Flaky && !m.tried[sku+"|"+key] {
		m.tried[sku+"|"+key] = true
		m.mu.Unlock()
		return "", answer(ctx, loadgen.Error(string(stock.CodeShardUnavailable)))
	}
	if op, ok := s.ops[key]; ok && !m.IgnoreKeys {
		m.mu.Unlock()
		if op.kind != kind || op.qty != qty {
			return "", answer(ctx, loadgen.Error(string(stock.CodeIdempotencyKeyReused)))
		}
		return op.reservationID, answer(ctx, loadgen.Replayed)
	}
	if s.available-qty < m.Hoard-m.Oversell {
		m.mu.Unlock()
		return "", answer(ctx, loadgen.OutOfStock)
	}
	if m.lose() {
		m.mu.Unlock()
		id := ""
		if kind == "reserve" {
			id = newID()
		}
		return id, answer(ctx, loadgen.OK)
	}
	e := memEntry{kind: kind, key: key, dAvail: -qty}
	op := memOp{kind: kind, qty: qty}
	s.available -= qty
	if kind == "deduct" {
		s.sold += qty
		e.dSold = qty
	} else {
		s.reserved += qty
		e.dReserved = qty
		op.reservationID = newID()
		e.reservationID = op.reservationID
		m.reservations[op.reservationID] = &memReservation{sku: sku, qty: qty, state: "held"}
	}
	s.ops[key] = op
	if !m.DropLedger {
		s.ledger = append(s.ledger, e)
	}
	m.mu.Unlock()
	return op.reservationID, answer(ctx, loadgen.OK)
}

// Commit sells a held reservation.
func (m *Memory) Commit(ctx context.Context, id string) loadgen.Outcome {
	return m.end(ctx, id, "committed")
}

// Release returns a held reservation.
func (m *Memory) Release(ctx context.Context, id string) loadgen.Outcome {
	return m.end(ctx, id, "released")
}

func (m *Memory) end(ctx context.Context, id, state string) loadgen.Outcome {
	m.wait(ctx)
	if e, ok := loadgen.ErrorFromContext(ctx); ok {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.reservations[id]
	switch {
	case !ok:
		return answer(ctx, loadgen.Error(string(stock.CodeReservationNotFound)))
	case r.state == state:
		return answer(ctx, loadgen.Replayed)
	case r.state == "committed":
		return answer(ctx, loadgen.Error(string(stock.CodeReservationAlreadyCommitted)))
	case r.state == "released":
		return answer(ctx, loadgen.Error(string(stock.CodeReservationAlreadyReleased)))
	}
	if state == "committed" && m.lose() {
		return answer(ctx, loadgen.OK)
	}
	s := m.skus[r.sku]
	r.state = state
	e := memEntry{key: id, dReserved: -r.qty}
	s.reserved -= r.qty
	if state == "committed" {
		e.kind, e.dSold = "commit", r.qty
		s.sold += r.qty
	} else {
		e.kind, e.dAvail = "release", r.qty
		s.available += r.qty
	}
	if !m.DropLedger {
		s.ledger = append(s.ledger, e)
	}
	return answer(ctx, loadgen.OK)
}

// Verify reads the counts and checks the ledger against them.
func (m *Memory) Verify(ctx context.Context, skus []loadgen.SKUSpec) (loadgen.State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := loadgen.State{SKUs: map[string]loadgen.SKUState{}}
	for _, spec := range skus {
		s, ok := m.skus[spec.SKU]
		if !ok {
			continue
		}
		out := loadgen.SKUState{Available: s.available, Reserved: s.reserved, Sold: s.sold, Ledger: map[string]int64{},
			Keys: map[string]loadgen.KeyRecord{}, Reservations: map[string]loadgen.ReservationRecord{}, Refunded: map[string]int64{}}
		keys, ends := map[string]bool{}, map[string]bool{}
		var da, dr, ds, endEntries int64
		for _, e := range s.ledger {
			out.Ledger[e.kind]++
			da, dr, ds = da+e.dAvail, dr+e.dReserved, ds+e.dSold
			switch e.kind {
			case "deduct", "reserve":
				out.Operations++
				keys[e.key] = true
				k := out.Keys[e.key]
				k.Kind, k.ReservationID = e.kind, e.reservationID
				k.Applied++
				out.Keys[e.key] = k
				if e.kind == "reserve" {
					out.Reservations[e.reservationID] = out.Reservations[e.reservationID]
				}
			case "commit", "release":
				endEntries++
				ends[e.key] = true // an end entry's key is the reservation id
				r := out.Reservations[e.key]
				if e.kind == "commit" {
					r.Committed++
				} else {
					r.Released++
				}
				out.Reservations[e.key] = r
			case "refund":
				out.Refunded[e.original] -= e.dSold
			}
		}
		out.DistinctKeys = int64(len(keys))
		out.ExtraEnds = endEntries - int64(len(ends))
		for _, c := range []struct {
			what      string
			want, got int64
		}{{"available", s.initial + da, s.available}, {"reserved", dr, s.reserved}, {"sold", ds, s.sold}} {
			if c.want != c.got {
				out.Discrepancies = append(out.Discrepancies, loadgen.Discrepancy{
					Check: "ledger_balance", Detail: c.what + ": opening balance plus ledger against the counter",
					Expected: c.want, Actual: c.got,
				})
			}
		}
		st.SKUs[spec.SKU] = out
	}
	return st, nil
}

// Close does nothing.
func (m *Memory) Close() error { return nil }

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
