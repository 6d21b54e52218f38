package stock

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// The planner's fixtures: one shard of one SKU, at one instant of the
// database clock.
var (
	planNow   = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	planShard = ShardKey{SKU: "plan-sku", Index: 2}
)

const planTTL = 10 * time.Minute

func planSKU() *SKU {
	return &SKU{Name: planShard.SKU, Status: StatusActive, Shards: 4, ReservationTTL: planTTL}
}

func keyed(kind OpKind, key string, q int64) *Request {
	r := &Request{Kind: kind, Shard: planShard, Quantity: q, Key: key, Source: SourceAPI}
	if kind == OpAdjust {
		r.Reason, r.Approver, r.Source = "recount", "alice", SourceAdminPrefix+"alice"
	}
	return r
}

func reserve(key string, q int64) *Request   { return keyed(OpReserve, key, q) }
func deduct(key string, q int64) *Request    { return keyed(OpDeduct, key, q) }
func replenish(key string, q int64) *Request { return keyed(OpReplenish, key, q) }
func adjust(key string, d int64) *Request    { return keyed(OpAdjust, key, d) }

// by sets a request's customer.
func by(customer string, r *Request) *Request { r.CustomerRef = customer; return r }

func commit(res *Reservation) *Request {
	return &Request{Kind: OpCommit, Shard: planShard, ReservationID: res.ID, Source: SourceAPI}
}

func release(res *Reservation) *Request {
	return &Request{Kind: OpRelease, Shard: planShard, ReservationID: res.ID, Reason: "cancelled", Source: SourceAPI}
}

func expireReq() *Request {
	return &Request{Kind: OpExpire, Shard: planShard, Source: SourceSweeper}
}

// hold is a reservation of the shard as the database holds it, expiring in
// the given time from planNow (negative: already due).
func hold(key string, q int64, in time.Duration, customer string) *Reservation {
	return &Reservation{ID: NewReservationID(planShard), SKU: planShard.SKU, Shard: planShard.Index,
		Quantity: q, State: ReservationHeld, ExpiresAt: planNow.Add(in), CustomerRef: customer, IdempotencyKey: key}
}

func endedHold(key string, q int64, st ReservationState) *Reservation {
	r := hold(key, q, time.Hour, "")
	r.State = st
	return r
}

// recorded is the operation a request left in the database an hour ago.
func recorded(r *Request) *Operation {
	op := &Operation{SKU: r.Shard.SKU, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, Shard: r.Shard.Index,
		ParamsHash: ParamsHash(r), OrderRef: r.OrderRef, CustomerRef: r.CustomerRef, CreatedAt: planNow.Add(-time.Hour)}
	if r.Kind == OpReserve {
		op.ReservationID = NewReservationID(r.Shard)
		op.ReservationState = ReservationHeld
		op.ReservationExpiresAt = planNow.Add(planTTL)
	}
	return op
}

// outcome is what the table expects of one result.
type outcome struct {
	code     Code // "" for success
	replayed bool
}

var (
	okay   = outcome{}
	replay = outcome{replayed: true}
)

func refused(c Code) outcome { return outcome{code: c} }

func (o outcome) String() string {
	if o.code == "" {
		return fmt.Sprintf("ok(replayed=%v)", o.replayed)
	}
	return string(o.code)
}

func outcomeOf(r Result) outcome {
	if r.Err != nil {
		return outcome{code: r.Err.Code}
	}
	return outcome{replayed: r.Replayed}
}

// planCase is one row of the planner's tables.
type planCase struct {
	name string
	from Counts
	// read changes the default read (an active SKU, nothing recorded).
	read   func(*BatchRead)
	reqs   []*Request
	sweep  bool
	want   []outcome
	to     Counts
	ledger []OpKind
	// check, if set, checks what the generic checks do not.
	check func(t *testing.T, w *BatchWrite, rs []Result)
}

func newRead() *BatchRead {
	return &BatchRead{SKU: planSKU(), Ops: map[string]*Operation{},
		Reservations: map[string]*Reservation{}, Usage: map[string]int64{}, Now: planNow}
}

// withReservations adds reservations to a read, as copies (the database
// returns fresh rows).
func withReservations(rs ...*Reservation) func(*BatchRead) {
	return func(r *BatchRead) {
		for _, res := range rs {
			c := *res
			r.Reservations[res.ID] = &c
		}
	}
}

// runPlan runs every case and checks what holds for every batch: each
// result as wanted, every result's Available the final available, the
// counts moved as the ledger says, the ledger a chain from the opening
// counts to the final ones, one operation per new keyed success, no
// reservation ended twice, and the read left as it was.
func runPlan(t *testing.T, tests []planCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := newRead()
			if tt.read != nil {
				tt.read(read)
			}
			before := snapshotRead(read)
			w, rs, err := EvaluateBatch(planShard, tt.from, tt.reqs, read, tt.sweep)
			if err != nil {
				t.Fatalf("EvaluateBatch(%s) = %v", tt.name, err)
			}

			if len(rs) != len(tt.reqs) {
				t.Fatalf("EvaluateBatch(%s) = %d results, want %d", tt.name, len(rs), len(tt.reqs))
			}
			got := make([]outcome, len(rs))
			for i, r := range rs {
				got[i] = outcomeOf(r)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("EvaluateBatch(%s) results = %v, want %v", tt.name, got, tt.want)
				for i, r := range rs {
					if r.Err != nil {
						t.Logf("result %d: %v", i, r.Err)
					}
				}
			}
			for i, r := range rs {
				if r.Available != tt.to.Available {
					t.Errorf("EvaluateBatch(%s) result %d Available = %d, want %d (the final available)", tt.name, i, r.Available, tt.to.Available)
				}
				if r.Err != nil && (r.Operation != nil || r.Reservation != nil) {
					t.Errorf("EvaluateBatch(%s) result %d = %+v, want an error with no operation or reservation", tt.name, i, r)
				}
			}
			if w.From != tt.from || w.To != tt.to {
				t.Errorf("EvaluateBatch(%s) write From, To = %+v, %+v, want %+v, %+v", tt.name, w.From, w.To, tt.from, tt.to)
			}
			checkLedger(t, tt.name, w, tt.from, tt.ledger)
			checkOps(t, tt.name, w, tt.reqs, rs)
			checkEnds(t, tt.name, w)
			if after := snapshotRead(read); after != before {
				t.Errorf("EvaluateBatch(%s) changed its read: %s, want %s", tt.name, after, before)
			}
			if tt.check != nil {
				tt.check(t, w, rs)
			}
		})
	}
}

func checkLedger(t *testing.T, name string, w *BatchWrite, from Counts, want []OpKind) {
	t.Helper()
	kinds := make([]OpKind, len(w.Ledger))
	prev := from
	for i, e := range w.Ledger {
		kinds[i] = e.Kind
		if e.Shard != planShard {
			t.Errorf("EvaluateBatch(%s) ledger %d shard = %s, want %s", name, i, e.Shard, planShard)
		}
		if e.Before != prev {
			t.Errorf("EvaluateBatch(%s) ledger %d (%s) Before = %+v, want %+v (the previous After)", name, i, e.Kind, e.Before, prev)
		}
		delta := e.Kind.Delta(e.Quantity)
		if got := e.Before.Add(delta); e.After != got {
			t.Errorf("EvaluateBatch(%s) ledger %d (%s %d) After = %+v, want %+v", name, i, e.Kind, e.Quantity, e.After, got)
		}
		if e.Source == "" {
			t.Errorf("EvaluateBatch(%s) ledger %d (%s) has no source", name, i, e.Kind)
		}
		prev = e.After
	}
	if !slices.Equal(kinds, want) {
		t.Errorf("EvaluateBatch(%s) ledger = %v, want %v", name, kinds, want)
	}
	if prev != w.To {
		t.Errorf("EvaluateBatch(%s) ledger ends at %+v, want the write's To %+v", name, prev, w.To)
	}
}

func checkOps(t *testing.T, name string, w *BatchWrite, reqs []*Request, rs []Result) {
	t.Helper()
	var newOps, newRes int
	for i, r := range rs {
		req := reqs[i]
		if r.Err != nil || r.Replayed || !req.Kind.Keyed() {
			continue
		}
		newOps++
		op := r.Operation
		if op == nil || op.IdempotencyKey != req.Key || op.Kind != req.Kind || op.Quantity != req.Quantity ||
			op.SKU != planShard.SKU || op.Shard != planShard.Index || !slices.Equal(op.ParamsHash, ParamsHash(req)) ||
			!op.CreatedAt.Equal(planNow) {
			t.Errorf("EvaluateBatch(%s) result %d operation = %+v, want one of %s %s q=%d", name, i, op, req.Kind, req.Key, req.Quantity)
		}
		if !slices.Contains(w.Ops, op) {
			t.Errorf("EvaluateBatch(%s) result %d operation %s is not in the write", name, i, req.Key)
		}
		if req.Kind == OpReserve {
			newRes++
			if r.Reservation == nil || r.Reservation.ID != op.ReservationID || r.Reservation.State != ReservationHeld {
				t.Errorf("EvaluateBatch(%s) result %d reservation = %+v, want held, id %s", name, i, r.Reservation, op.ReservationID)
			}
		}
	}
	if len(w.Ops) != newOps {
		t.Errorf("EvaluateBatch(%s) write has %d operations, want %d", name, len(w.Ops), newOps)
	}
	if len(w.NewReservations) != newRes {
		t.Errorf("EvaluateBatch(%s) write has %d new reservations, want %d", name, len(w.NewReservations), newRes)
	}
	keys := map[string]bool{}
	for _, op := range w.Ops {
		if keys[op.IdempotencyKey] {
			t.Errorf("EvaluateBatch(%s) writes key %s twice", name, op.IdempotencyKey)
		}
		keys[op.IdempotencyKey] = true
	}
}

// checkEnds: a reservation ends exactly once, with one end entry.
func checkEnds(t *testing.T, name string, w *BatchWrite) {
	t.Helper()
	ended := map[string]ReservationState{}
	for _, e := range w.Ended {
		if _, dup := ended[e.ID]; dup {
			t.Errorf("EvaluateBatch(%s) ends reservation %s twice", name, e.ID)
		}
		ended[e.ID] = e.State
	}
	entries, rests := map[string]int{}, map[string]int{}
	for _, e := range w.Ledger {
		if e.Kind == OpRelease && ended[e.ReservationID] == ReservationCommitted {
			// A partial commit releases the rest in the same step.
			if rests[e.ReservationID]++; rests[e.ReservationID] > 1 {
				t.Errorf("EvaluateBatch(%s) releases the rest of %s twice", name, e.ReservationID)
			}
			continue
		}
		switch e.Kind {
		case OpCommit, OpRelease, OpExpire:
			entries[e.ReservationID]++
			want := map[OpKind]ReservationState{OpCommit: ReservationCommitted,
				OpRelease: ReservationReleased, OpExpire: ReservationExpired}[e.Kind]
			if st, ok := ended[e.ReservationID]; !ok || st != want {
				t.Errorf("EvaluateBatch(%s) %s entry for %s ends it as %q, want %q", name, e.Kind, e.ReservationID, st, want)
			}
		}
	}
	for id, n := range entries {
		if n != 1 {
			t.Errorf("EvaluateBatch(%s) writes %d end entries for %s, want 1", name, n, id)
		}
	}
	if len(entries) != len(ended) {
		t.Errorf("EvaluateBatch(%s) ends %d reservations with %d end entries, want one each", name, len(ended), len(entries))
	}
}

// snapshotRead renders what plan must not change.
func snapshotRead(r *BatchRead) string {
	s := fmt.Sprintf("sku=%+v usage=%v", r.SKU, r.Usage)
	for _, id := range slices.Sorted(maps.Keys(r.Reservations)) {
		s += fmt.Sprintf(" %+v", *r.Reservations[id])
	}
	for _, d := range r.Due {
		s += fmt.Sprintf(" due%+v", *d)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Ops)) {
		s += fmt.Sprintf(" %+v", *r.Ops[k])
	}
	return s
}

func TestPlan_Keyed(t *testing.T) {
	ten := Counts{Available: 10}
	runPlan(t, []planCase{
		{
			name: "OK",
			from: ten,
			reqs: []*Request{by("c-1", reserve("k-1", 3))},
			want: []outcome{okay}, to: Counts{Available: 7, Reserved: 3}, ledger: []OpKind{OpReserve},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				res := w.NewReservations[0]
				if rs[0].Reservation != res || !res.ExpiresAt.Equal(planNow.Add(planTTL)) || res.Quantity != 3 ||
					res.CustomerRef != "c-1" || res.IdempotencyKey != "k-1" {
					t.Errorf("EvaluateBatch(reserve) reservation = %+v, want held 3 for c-1 until now+%s", res, planTTL)
				}
				if k, err := ParseReservationID(res.ID); err != nil || k != planShard {
					t.Errorf("ParseReservationID(%s) = %v, %v, want %s", res.ID, k, err, planShard)
				}
				e := w.Ledger[0]
				if e.ReservationID != res.ID || e.IdempotencyKey != "k-1" || e.Quantity != 3 || e.Source != SourceAPI {
					t.Errorf("EvaluateBatch(reserve) ledger entry = %+v, want reservation %s, key k-1, quantity 3, source api", e, res.ID)
				}
			},
		},
		{
			name: "ReserveTTL",
			from: ten,
			reqs: []*Request{func() *Request { r := reserve("k-1", 1); r.TTL = 90 * time.Second; return r }()},
			want: []outcome{okay}, to: Counts{Available: 9, Reserved: 1}, ledger: []OpKind{OpReserve},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if got := rs[0].Reservation.ExpiresAt; !got.Equal(planNow.Add(90 * time.Second)) {
					t.Errorf("EvaluateBatch(reserve ttl 90s) ExpiresAt = %v, want %v", got, planNow.Add(90*time.Second))
				}
			},
		},
		{
			name: "Deduct",
			from: ten,
			reqs: []*Request{func() *Request { r := deduct("k-1", 4); r.OrderRef = "o-1"; return r }()},
			want: []outcome{okay}, to: Counts{Available: 6, Sold: 4}, ledger: []OpKind{OpDeduct},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if e := w.Ledger[0]; e.OrderRef != "o-1" || e.IdempotencyKey != "k-1" || e.ReservationID != "" {
					t.Errorf("EvaluateBatch(deduct) ledger entry = %+v, want order o-1, key k-1, no reservation", e)
				}
				if len(w.NewReservations) != 0 || rs[0].Reservation != nil {
					t.Errorf("EvaluateBatch(deduct) made a reservation: %+v", w.NewReservations)
				}
			},
		},
		{
			name: "Replenish",
			from: ten,
			reqs: []*Request{replenish("k-1", 5)},
			want: []outcome{okay}, to: Counts{Available: 15}, ledger: []OpKind{OpReplenish},
		},
		{
			name: "Adjust",
			from: ten,
			reqs: []*Request{adjust("k-1", 5)},
			want: []outcome{okay}, to: Counts{Available: 15}, ledger: []OpKind{OpAdjust},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if e := w.Ledger[0]; e.Reason != "recount" || e.Approver != "alice" || e.Source != "admin:alice" {
					t.Errorf("EvaluateBatch(adjust) ledger entry = %+v, want reason recount, approver alice, source admin:alice", e)
				}
			},
		},
		{
			name: "AdjustDown",
			from: ten,
			reqs: []*Request{adjust("k-1", -10)},
			want: []outcome{okay}, to: Counts{}, ledger: []OpKind{OpAdjust},
		},
		{
			name: "AdjustBelowZero",
			from: ten,
			reqs: []*Request{adjust("k-1", -11), adjust("k-2", -1)},
			want: []outcome{refused(CodeOutOfStock), okay}, to: Counts{Available: 9}, ledger: []OpKind{OpAdjust},
		},
		{
			name: "Ceiling",
			// Held (available plus reserved) may reach ShardCountMax, not
			// pass it; a refusal leaves room for what fits after it, and
			// what takes stock out makes room.
			from:   Counts{Available: ShardCountMax - 4, Reserved: 1},
			reqs:   []*Request{replenish("k-1", 4), adjust("k-2", 4), replenish("k-3", 3), adjust("k-4", 1), deduct("k-5", 2), adjust("k-6", 2)},
			want:   []outcome{refused(CodeInvalidQuantity), refused(CodeInvalidQuantity), okay, refused(CodeInvalidQuantity), okay, okay},
			to:     Counts{Available: ShardCountMax - 1, Reserved: 1, Sold: 2},
			ledger: []OpKind{OpReplenish, OpDeduct, OpAdjust},
		},
		{
			name: "Mixed",
			from: Counts{Available: 10, Reserved: 2, Sold: 1},
			reqs: []*Request{reserve("k-1", 3), deduct("k-2", 2), replenish("k-3", 4), adjust("k-4", -1)},
			want: []outcome{okay, okay, okay, okay}, to: Counts{Available: 8, Reserved: 5, Sold: 3},
			ledger: []OpKind{OpReserve, OpDeduct, OpReplenish, OpAdjust},
		},
		{
			name: "Exact",
			from: Counts{Available: 3},
			reqs: []*Request{reserve("k-1", 3)},
			want: []outcome{okay}, to: Counts{Reserved: 3}, ledger: []OpKind{OpReserve},
		},
		{
			name: "OutOfStock",
			from: Counts{Available: 2},
			reqs: []*Request{deduct("k-1", 3), reserve("k-2", 3)},
			want: []outcome{refused(CodeOutOfStock), refused(CodeOutOfStock)}, to: Counts{Available: 2},
		},
		{
			name: "NoHeadOfLine",
			// A refusal does not block what fits after it.
			from: Counts{Available: 2},
			reqs: []*Request{deduct("k-1", 3), reserve("k-2", 1), deduct("k-3", 2), deduct("k-4", 1)},
			want: []outcome{refused(CodeOutOfStock), okay, refused(CodeOutOfStock), okay},
			to:   Counts{Reserved: 1, Sold: 1}, ledger: []OpKind{OpReserve, OpDeduct},
		},
		{
			name: "ReplenishRefills",
			from: Counts{},
			reqs: []*Request{deduct("k-1", 1), replenish("k-2", 2), deduct("k-3", 2)},
			want: []outcome{refused(CodeOutOfStock), okay, okay},
			to:   Counts{Sold: 2}, ledger: []OpKind{OpReplenish, OpDeduct},
		},
		{
			name: "MaxPerOrder",
			from: ten,
			read: func(r *BatchRead) { r.SKU.MaxPerOrder = 2 },
			reqs: []*Request{deduct("k-1", 3), reserve("k-2", 3), deduct("k-3", 2), replenish("k-4", 3)},
			want: []outcome{refused(CodeQuantityAboveMaxPerOrder), refused(CodeQuantityAboveMaxPerOrder), okay, okay},
			to:   Counts{Available: 11, Sold: 2}, ledger: []OpKind{OpDeduct, OpReplenish},
		},
		{
			name: "Paused",
			from: ten,
			read: func(r *BatchRead) { r.SKU.Status = StatusPaused },
			reqs: []*Request{reserve("k-1", 1), deduct("k-2", 1), replenish("k-3", 2), adjust("k-4", 1)},
			want: []outcome{refused(CodeSKUPaused), refused(CodeSKUPaused), okay, okay},
			to:   Counts{Available: 13}, ledger: []OpKind{OpReplenish, OpAdjust},
		},
		{
			name: "NilSKU",
			from: ten,
			read: func(r *BatchRead) { r.SKU = nil },
			reqs: []*Request{reserve("k-1", 1), deduct("k-2", 1), replenish("k-3", 2), adjust("k-4", 1)},
			want: []outcome{refused(CodeSKUNotFound), refused(CodeSKUNotFound), refused(CodeSKUNotFound), refused(CodeSKUNotFound)},
			to:   ten,
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if !w.Empty() {
					t.Errorf("EvaluateBatch(nil sku) write = %+v, want empty", w)
				}
			},
		},
		{
			name: "Empty",
			from: ten,
			to:   ten,
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if !w.Empty() {
					t.Errorf("EvaluateBatch(no requests) write = %+v, want empty", w)
				}
			},
		},
	})
}

func TestPlan_Replay(t *testing.T) {
	ten := Counts{Available: 10}
	recDeduct := recorded(deduct("k-1", 2))
	recReserve := recorded(by("c-1", reserve("k-r", 3)))
	recOther := recorded(&Request{Kind: OpDeduct, Shard: ShardKey{SKU: "other-sku"}, Quantity: 2, Key: "k-1", Source: SourceAPI})
	withOps := func(ops ...*Operation) func(*BatchRead) {
		return func(r *BatchRead) {
			for _, op := range ops {
				c := *op
				r.Ops[op.IdempotencyKey] = &c
			}
		}
	}
	// The reservation recReserve made, held in the database.
	recHold := &Reservation{ID: recReserve.ReservationID, SKU: planShard.SKU, Shard: planShard.Index, Quantity: 3,
		State: ReservationHeld, ExpiresAt: recReserve.ReservationExpiresAt, CustomerRef: "c-1", IdempotencyKey: "k-r"}
	heldOne := hold("k-h", 3, time.Hour, "")
	sameOp := func(i, j int) func(t *testing.T, w *BatchWrite, rs []Result) {
		return func(t *testing.T, w *BatchWrite, rs []Result) {
			if rs[i].Operation == nil || rs[i].Operation != rs[j].Operation {
				t.Errorf("plan results %d, %d operations = %p, %p, want the same", i, j, rs[i].Operation, rs[j].Operation)
			}
			if rs[i].Reservation != rs[j].Reservation {
				t.Errorf("plan results %d, %d reservations = %+v, %+v, want the same", i, j, rs[i].Reservation, rs[j].Reservation)
			}
		}
	}
	runPlan(t, []planCase{
		{
			name: "OK",
			from: ten,
			reqs: []*Request{deduct("k-1", 2), deduct("k-1", 2)},
			want: []outcome{okay, replay}, to: Counts{Available: 8, Sold: 2}, ledger: []OpKind{OpDeduct},
			check: sameOp(0, 1),
		},
		{
			name: "SameKeyReserve",
			from: ten,
			reqs: []*Request{reserve("k-1", 2), deduct("k-2", 1), reserve("k-1", 2)},
			want: []outcome{okay, okay, replay}, to: Counts{Available: 7, Reserved: 2, Sold: 1},
			ledger: []OpKind{OpReserve, OpDeduct},
			check:  sameOp(0, 2),
		},
		{
			name: "SameKeyOtherQuantity",
			from: ten,
			reqs: []*Request{deduct("k-1", 2), deduct("k-1", 3)},
			want: []outcome{okay, refused(CodeIdempotencyKeyReused)}, to: Counts{Available: 8, Sold: 2},
			ledger: []OpKind{OpDeduct},
		},
		{
			name: "SameKeyOtherKind",
			from: ten,
			reqs: []*Request{deduct("k-1", 2), reserve("k-1", 2)},
			want: []outcome{okay, refused(CodeIdempotencyKeyReused)}, to: Counts{Available: 8, Sold: 2},
			ledger: []OpKind{OpDeduct},
		},
		{
			name: "SameKeyOtherOrderRef",
			from: ten,
			reqs: []*Request{deduct("k-1", 2), func() *Request { r := deduct("k-1", 2); r.OrderRef = "o-2"; return r }()},
			want: []outcome{okay, refused(CodeIdempotencyKeyReused)}, to: Counts{Available: 8, Sold: 2},
			ledger: []OpKind{OpDeduct},
		},
		{
			name: "SameKeyRefusedTwice",
			from: Counts{Available: 1},
			reqs: []*Request{deduct("k-1", 2), deduct("k-1", 2)},
			want: []outcome{refused(CodeOutOfStock), refused(CodeOutOfStock)}, to: Counts{Available: 1},
		},
		{
			name: "SameKeyRetryAfterOutOfStock",
			// A refusal for stock writes no operation, so the key stays
			// free: applied one at a time, the retry after the release
			// finds 3 units and succeeds. Refusing it is a false sold-out
			// (invariant 3).
			from: Counts{Reserved: 3},
			read: withReservations(heldOne),
			reqs: []*Request{reserve("k-1", 2), release(heldOne), reserve("k-1", 2)},
			want: []outcome{refused(CodeOutOfStock), okay, okay}, to: Counts{Available: 1, Reserved: 2},
			ledger: []OpKind{OpRelease, OpReserve},
		},
		{
			name: "Recorded",
			from: ten,
			read: withOps(recDeduct),
			reqs: []*Request{deduct("k-1", 2)},
			want: []outcome{replay}, to: ten,
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if op := rs[0].Operation; op == nil || op.Quantity != 2 || !op.CreatedAt.Equal(recDeduct.CreatedAt) {
					t.Errorf("EvaluateBatch(replay) operation = %+v, want the recorded one %+v", op, recDeduct)
				}
				if !w.Empty() {
					t.Errorf("EvaluateBatch(replay) write = %+v, want empty", w)
				}
			},
		},
		{
			name: "RecordedSoldOut",
			// A replay returns its first result even after the sell-out.
			from: Counts{Sold: 10},
			read: withOps(recDeduct),
			reqs: []*Request{deduct("k-1", 2), deduct("k-2", 2)},
			want: []outcome{replay, refused(CodeOutOfStock)}, to: Counts{Sold: 10},
		},
		{
			name: "RecordedPaused",
			from: ten,
			read: func(r *BatchRead) { withOps(recDeduct)(r); r.SKU.Status = StatusPaused },
			reqs: []*Request{deduct("k-1", 2)},
			want: []outcome{replay}, to: ten,
		},
		{
			name: "RecordedTwice",
			from: ten,
			read: withOps(recDeduct),
			reqs: []*Request{deduct("k-1", 2), deduct("k-1", 2)},
			want: []outcome{replay, replay}, to: ten,
		},
		{
			name: "RecordedReserve",
			from: Counts{Available: 7, Reserved: 3},
			read: withOps(recReserve),
			reqs: []*Request{by("c-1", reserve("k-r", 3))},
			want: []outcome{replay}, to: Counts{Available: 7, Reserved: 3},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				res := rs[0].Reservation
				if res == nil || res.ID != recReserve.ReservationID || res.State != ReservationHeld || res.Quantity != 3 ||
					!res.ExpiresAt.Equal(recReserve.ReservationExpiresAt) || res.CustomerRef != "c-1" {
					t.Errorf("EvaluateBatch(replay reserve) reservation = %+v, want the recorded hold %s", res, recReserve.ReservationID)
				}
			},
		},
		{
			name: "RecordedReserveCommittedInBatch",
			// The replay reports the reservation as the batch left it.
			from: Counts{Available: 7, Reserved: 3},
			read: func(r *BatchRead) { withOps(recReserve)(r); withReservations(recHold)(r) },
			reqs: []*Request{commit(recHold), by("c-1", reserve("k-r", 3))},
			want: []outcome{okay, replay}, to: Counts{Available: 7, Sold: 3}, ledger: []OpKind{OpCommit},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if st := rs[1].Reservation.State; st != ReservationCommitted {
					t.Errorf("EvaluateBatch(commit, replay reserve) replayed state = %s, want committed", st)
				}
			},
		},
		{
			name: "RecordedOtherSKU",
			from: ten,
			read: withOps(recOther),
			reqs: []*Request{deduct("k-1", 2)},
			want: []outcome{refused(CodeIdempotencyKeyReused)}, to: ten,
		},
		{
			name: "RecordedOtherQuantity",
			from: ten,
			read: withOps(recDeduct),
			reqs: []*Request{deduct("k-1", 3)},
			want: []outcome{refused(CodeIdempotencyKeyReused)}, to: ten,
		},
		{
			name: "RecordedOtherKind",
			from: ten,
			read: withOps(recDeduct),
			reqs: []*Request{reserve("k-1", 2)},
			want: []outcome{refused(CodeIdempotencyKeyReused)}, to: ten,
		},
		{
			name: "RecordedReusedThenRetried",
			// The key is recorded for 2: a request for 3 is refused as a
			// reuse, and the retry with the recorded parameters is a replay
			// of the recorded operation (invariant 2), whatever came before
			// it in the batch.
			from: ten,
			read: withOps(recDeduct),
			reqs: []*Request{deduct("k-1", 3), deduct("k-1", 2)},
			want: []outcome{refused(CodeIdempotencyKeyReused), replay}, to: ten,
		},
	})
}

func TestPlan_ReservationEnds(t *testing.T) {
	a := hold("k-a", 3, time.Hour, "")
	b := hold("k-b", 3, time.Hour, "")
	due := hold("k-due", 2, -time.Second, "")
	now := hold("k-now", 2, 0, "") // expires at this very instant
	committed := endedHold("k-com", 2, ReservationCommitted)
	released := endedHold("k-rel", 2, ReservationReleased)
	expired := endedHold("k-exp", 2, ReservationExpired)
	elsewhere := hold("k-else", 1, time.Hour, "")
	elsewhere.Shard = planShard.Index + 1
	unknown := hold("k-unknown", 1, time.Hour, "")

	// from holds a, b and due (3 + 3 + 2); now is not among them.
	from := Counts{Available: 10, Reserved: 8}
	read := withReservations(a, b, due, committed, released, expired, elsewhere)
	state := func(i int, want ReservationState) func(t *testing.T, w *BatchWrite, rs []Result) {
		return func(t *testing.T, w *BatchWrite, rs []Result) {
			if rs[i].Reservation == nil || rs[i].Reservation.State != want {
				t.Errorf("plan result %d reservation = %+v, want state %s", i, rs[i].Reservation, want)
			}
		}
	}
	runPlan(t, []planCase{
		{
			name: "OK",
			from: from, read: read,
			reqs: []*Request{commit(a)},
			want: []outcome{okay}, to: Counts{Available: 10, Reserved: 5, Sold: 3}, ledger: []OpKind{OpCommit},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				state(0, ReservationCommitted)(t, w, rs)
				if e := w.Ledger[0]; e.ReservationID != a.ID || e.IdempotencyKey != "k-a" || e.Quantity != 3 {
					t.Errorf("EvaluateBatch(commit) ledger entry = %+v, want reservation %s, key k-a, quantity 3", e, a.ID)
				}
			},
		},
		{
			name: "Release",
			from: from, read: read,
			reqs: []*Request{release(a)},
			want: []outcome{okay}, to: Counts{Available: 13, Reserved: 5}, ledger: []OpKind{OpRelease},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				state(0, ReservationReleased)(t, w, rs)
				if e := w.Ended[0]; e.ID != a.ID || e.Reason != "cancelled" {
					t.Errorf("EvaluateBatch(release) ended = %+v, want %s for reason cancelled", e, a.ID)
				}
			},
		},
		{
			name: "CommitThenRelease",
			from: from, read: read,
			reqs: []*Request{commit(a), release(a)},
			want: []outcome{okay, refused(CodeReservationAlreadyCommitted)},
			to:   Counts{Available: 10, Reserved: 5, Sold: 3}, ledger: []OpKind{OpCommit},
		},
		{
			name: "ReleaseThenCommit",
			from: from, read: read,
			reqs: []*Request{release(a), commit(a)},
			want: []outcome{okay, refused(CodeReservationAlreadyReleased)},
			to:   Counts{Available: 13, Reserved: 5}, ledger: []OpKind{OpRelease},
		},
		{
			name: "CommitTwice",
			from: from, read: read,
			reqs: []*Request{commit(a), commit(a)},
			want: []outcome{okay, replay},
			to:   Counts{Available: 10, Reserved: 5, Sold: 3}, ledger: []OpKind{OpCommit},
			check: state(1, ReservationCommitted),
		},
		{
			name: "ReleaseTwice",
			from: from, read: read,
			reqs: []*Request{release(a), release(a)},
			want: []outcome{okay, replay},
			to:   Counts{Available: 13, Reserved: 5}, ledger: []OpKind{OpRelease},
		},
		{
			name: "TwoReservations",
			from: from, read: read,
			reqs: []*Request{release(a), commit(b), reserve("k-1", 13)},
			want: []outcome{okay, okay, okay},
			to:   Counts{Reserved: 15, Sold: 3}, ledger: []OpKind{OpRelease, OpCommit, OpReserve},
		},
		{
			name: "Committed",
			from: from, read: read,
			reqs: []*Request{commit(committed), release(committed)},
			want: []outcome{replay, refused(CodeReservationAlreadyCommitted)}, to: from,
		},
		{
			name: "Released",
			from: from, read: read,
			reqs: []*Request{release(released), commit(released)},
			want: []outcome{replay, refused(CodeReservationAlreadyReleased)}, to: from,
		},
		{
			name: "Expired",
			from: from, read: read,
			reqs: []*Request{release(expired), commit(expired)},
			want: []outcome{replay, refused(CodeReservationExpired)}, to: from,
		},
		{
			name: "CommitDue",
			// Due but not yet swept: it expires first, in this batch, and
			// the commit reports it.
			from: from, read: read,
			reqs: []*Request{commit(due)},
			want: []outcome{refused(CodeReservationExpired)},
			to:   Counts{Available: 12, Reserved: 6}, ledger: []OpKind{OpExpire},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if len(w.Ended) != 1 || w.Ended[0].ID != due.ID || w.Ended[0].State != ReservationExpired {
					t.Errorf("EvaluateBatch(commit due) ended = %+v, want %s expired", w.Ended, due.ID)
				}
			},
		},
		{
			name: "CommitAtExpiry",
			from: Counts{Reserved: 2}, read: withReservations(now),
			reqs: []*Request{commit(now)},
			want: []outcome{refused(CodeReservationExpired)},
			to:   Counts{Available: 2}, ledger: []OpKind{OpExpire},
		},
		{
			name: "ReleaseDue",
			from: from, read: read,
			reqs: []*Request{release(due), commit(due)},
			want: []outcome{replay, refused(CodeReservationExpired)},
			to:   Counts{Available: 12, Reserved: 6}, ledger: []OpKind{OpExpire},
			check: state(0, ReservationExpired),
		},
		{
			name: "NotFound",
			from: from, read: read,
			reqs: []*Request{commit(unknown), release(unknown), commit(elsewhere)},
			want: []outcome{refused(CodeReservationNotFound), refused(CodeReservationNotFound), refused(CodeReservationNotFound)},
			to:   from,
		},
	})
}

func TestPlan_Sweep(t *testing.T) {
	d1 := hold("k-d1", 2, -time.Minute, "")
	d2 := hold("k-d2", 3, -time.Second, "")
	live := hold("k-live", 1, time.Hour, "")
	from := Counts{Available: 4, Reserved: 6}
	read := func(r *BatchRead) {
		withReservations(d1, d2, live)(r)
		for _, d := range []*Reservation{d1, d2} {
			c := *d
			r.Due = append(r.Due, &c)
		}
	}
	sources := func(want ...string) func(t *testing.T, w *BatchWrite, rs []Result) {
		return func(t *testing.T, w *BatchWrite, rs []Result) {
			got := make([]string, len(w.Ledger))
			for i, e := range w.Ledger {
				got[i] = e.Source
			}
			if !slices.Equal(got, want) {
				t.Errorf("EvaluateBatch(sweep) ledger sources = %v, want %v", got, want)
			}
		}
	}
	runPlan(t, []planCase{
		{
			name: "OK",
			from: from, read: read, sweep: true,
			reqs: []*Request{expireReq()},
			want: []outcome{okay}, to: Counts{Available: 9, Reserved: 1},
			ledger: []OpKind{OpExpire, OpExpire},
			check:  sources(SourceSweeper, SourceSweeper),
		},
		{
			name: "Off",
			from: from, read: read,
			reqs: []*Request{expireReq()},
			want: []outcome{okay}, to: from,
		},
		{
			name: "ReleaseInBatch",
			// The release finds d1 due and expires it; the sweep then
			// expires only d2.
			from: from, read: read, sweep: true,
			reqs: []*Request{release(d1), expireReq()},
			want: []outcome{replay, okay}, to: Counts{Available: 9, Reserved: 1},
			ledger: []OpKind{OpExpire, OpExpire},
			check:  sources(SourceAPI, SourceSweeper),
		},
		{
			name: "CommitInBatch",
			from: from, read: read, sweep: true,
			reqs: []*Request{expireReq(), commit(d2), commit(live)},
			want: []outcome{okay, refused(CodeReservationExpired), okay}, to: Counts{Available: 9, Sold: 1},
			ledger: []OpKind{OpExpire, OpCommit, OpExpire},
		},
		{
			name: "AndReserve",
			// Requests are decided before the sweep: a reserve cannot use
			// the units the sweep frees in the same batch, but is not
			// refused for stock that is there.
			from: from, read: read, sweep: true,
			reqs: []*Request{reserve("k-1", 4), expireReq(), reserve("k-2", 1)},
			want: []outcome{okay, okay, refused(CodeOutOfStock)}, to: Counts{Available: 5, Reserved: 5},
			ledger: []OpKind{OpReserve, OpExpire, OpExpire},
		},
	})
}

func TestPlan_CustomerLimit(t *testing.T) {
	held := hold("k-h", 3, time.Hour, "c")
	due := hold("k-due", 2, -time.Second, "c")
	limit := func(n int64, usage map[string]int64, rs ...*Reservation) func(*BatchRead) {
		return func(r *BatchRead) {
			r.SKU.CustomerLimit = n
			maps.Copy(r.Usage, usage)
			withReservations(rs...)(r)
		}
	}
	usage := func(add, sub map[string]int64) func(t *testing.T, w *BatchWrite, rs []Result) {
		return func(t *testing.T, w *BatchWrite, rs []Result) {
			if !maps.Equal(w.UsageAdd, add) || !maps.Equal(w.UsageSub, sub) {
				t.Errorf("plan write usage add, sub = %v, %v, want %v, %v", w.UsageAdd, w.UsageSub, add, sub)
			}
		}
	}
	runPlan(t, []planCase{
		{
			name: "OK",
			// c holds 3 of 5; a release gives 3 back within the batch. A
			// request that names no customer cannot dodge the limit.
			from: Counts{Available: 10, Reserved: 3},
			read: limit(5, map[string]int64{"c": 3}, held),
			reqs: []*Request{
				by("c", reserve("k-1", 2)), by("c", reserve("k-2", 1)), by("c", deduct("k-3", 1)),
				release(held), by("c", deduct("k-4", 3)), by("d", reserve("k-5", 4)), reserve("k-6", 1), deduct("k-7", 1),
			},
			want: []outcome{okay, refused(CodeCustomerLimitReached), refused(CodeCustomerLimitReached), okay, okay, okay,
				refused(CodeCustomerRefRequired), refused(CodeCustomerRefRequired)},
			to:     Counts{Available: 4, Reserved: 6, Sold: 3},
			ledger: []OpKind{OpReserve, OpRelease, OpDeduct, OpReserve},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				usage(map[string]int64{"c": 5, "d": 4}, map[string]int64{"c": 3})(t, w, rs)
				if w.UsageLimit != 5 {
					t.Errorf("plan write UsageLimit = %d, want 5", w.UsageLimit)
				}
			},
		},
		{
			name: "CommitKeeps",
			from: Counts{Available: 10, Reserved: 3},
			read: limit(5, map[string]int64{"c": 3}, held),
			reqs: []*Request{commit(held), by("c", reserve("k-1", 3)), by("c", reserve("k-2", 2))},
			want: []outcome{okay, refused(CodeCustomerLimitReached), okay},
			to:   Counts{Available: 8, Reserved: 2, Sold: 3}, ledger: []OpKind{OpCommit, OpReserve},
			check: usage(map[string]int64{"c": 2}, nil),
		},
		{
			name: "ExpiryGivesBack",
			from: Counts{Available: 10, Reserved: 2},
			read: limit(5, map[string]int64{"c": 5}, due),
			reqs: []*Request{by("c", reserve("k-1", 1)), release(due), by("c", reserve("k-2", 2))},
			want: []outcome{refused(CodeCustomerLimitReached), replay, okay},
			to:   Counts{Available: 10, Reserved: 2}, ledger: []OpKind{OpExpire, OpReserve},
			check: usage(map[string]int64{"c": 2}, map[string]int64{"c": 2}),
		},
		{
			name: "ReplayNotCounted",
			from: Counts{Available: 10, Sold: 5},
			read: func(r *BatchRead) {
				limit(5, map[string]int64{"c": 5})(r)
				r.Ops["k-1"] = recorded(by("c", deduct("k-1", 5)))
			},
			reqs:  []*Request{by("c", deduct("k-1", 5)), by("c", deduct("k-2", 1))},
			want:  []outcome{replay, refused(CodeCustomerLimitReached)},
			to:    Counts{Available: 10, Sold: 5},
			check: usage(nil, nil),
		},
		{
			name: "NoLimit",
			from: Counts{Available: 10},
			reqs: []*Request{by("c", deduct("k-1", 9))},
			want: []outcome{okay}, to: Counts{Available: 1, Sold: 9}, ledger: []OpKind{OpDeduct},
			check: usage(nil, nil),
		},
	})
}

// TestPlan_Invariant: a batch that would drive a count negative is refused
// with an error (the writer halts the shard), not written and not a panic.
func TestPlan_Invariant(t *testing.T) {
	read := newRead()
	// A reservation the row does not account for: releasing it would take
	// reserved below zero.
	read.Reservations["r"] = &Reservation{ID: "r", SKU: planShard.SKU, Shard: planShard.Index, Quantity: 5,
		State: ReservationHeld, ExpiresAt: read.Now.Add(time.Hour)}
	_, _, err := EvaluateBatch(planShard, Counts{Available: 10}, []*Request{{Kind: OpRelease, Shard: planShard, ReservationID: "r"}}, read, false)
	if !errors.Is(err, ErrInvariant) {
		t.Errorf("EvaluateBatch(release of an unaccounted hold) = %v, want ErrInvariant", err)
	}
}

func refund(key, sale string, q int64) *Request {
	r := keyed(OpRefund, key, q)
	r.Original = Sale{DeductKey: sale}
	return r
}

// TestPlan_Bend: a partial commit is a commit entry and a release entry in
// one batch; an extension moves the expiry within max_hold and ledgers an
// entry of no delta; refunds in one batch count each other against their
// sale, and the read's refunds too.
func TestPlan_Bend(t *testing.T) {
	held := hold("k-h", 3, time.Minute, "")
	held.CreatedAt = planNow.Add(-time.Minute)
	partial := commit(held)
	partial.Quantity = 2
	extend := &Request{Kind: OpExtend, Shard: planShard, ReservationID: held.ID, TTL: time.Hour, Source: SourceAPI}
	tooLong := *extend
	tooLong.TTL = 30 * time.Hour
	sale := func(refunded int64) func(*BatchRead) {
		return func(r *BatchRead) {
			r.Ops["sale"] = recorded(deduct("sale", 3))
			r.Refunded = map[string]int64{"deduct:sale": refunded}
		}
	}
	runPlan(t, []planCase{
		{
			name: "PartialCommit",
			from: Counts{Available: 10, Reserved: 3}, read: withReservations(held),
			reqs: []*Request{partial, commit(held)}, want: []outcome{okay, replay},
			to: Counts{Available: 11, Sold: 2}, ledger: []OpKind{OpCommit, OpRelease},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if len(w.Ended) != 1 || w.Ended[0].Committed != 2 || rs[1].Reservation.Committed != 2 {
					t.Errorf("ends %+v, replay %+v, want one end that bought 2", w.Ended, rs[1].Reservation)
				}
			},
		},
		{
			name: "ExtendThenCommit",
			from: Counts{Available: 10, Reserved: 3}, read: withReservations(held),
			reqs: []*Request{&tooLong, extend, commit(held)}, want: []outcome{refused(CodeHoldLimitReached), okay, okay},
			to: Counts{Available: 10, Sold: 3}, ledger: []OpKind{OpExtend, OpCommit},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if len(w.Extended) != 1 || !w.Extended[0].ExpiresAt.Equal(planNow.Add(time.Hour)) {
					t.Errorf("extended %+v, want one, to an hour from now", w.Extended)
				}
			},
		},
		{
			name: "Refunds",
			from: Counts{Available: 7, Sold: 3}, read: sale(0),
			reqs: []*Request{refund("rf-1", "sale", 2), refund("rf-2", "sale", 1), refund("rf-3", "sale", 1), refund("rf-1", "sale", 2)},
			want: []outcome{okay, okay, refused(CodeRefundExceedsSale), replay},
			to:   Counts{Available: 10}, ledger: []OpKind{OpRefund, OpRefund},
			check: func(t *testing.T, w *BatchWrite, rs []Result) {
				if len(w.Refunds) != 2 || w.Refunds[0].Sold != 3 || w.Ledger[0].Original.DeductKey != "sale" {
					t.Errorf("refunds %+v, ledger %+v, want two of the sale of 3, naming it", w.Refunds, w.Ledger)
				}
			},
		},
		{
			name: "RefundedAlready",
			from: Counts{Available: 7, Sold: 3}, read: sale(3),
			reqs: []*Request{refund("rf-4", "sale", 1), refund("rf-5", "nothing", 1)},
			want: []outcome{refused(CodeRefundExceedsSale), refused(CodeSaleNotFound)},
			to:   Counts{Available: 7, Sold: 3},
		},
	})
}
