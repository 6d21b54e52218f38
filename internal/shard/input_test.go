package shard_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// state is what a refused request must leave alone.
type state struct {
	counts  stock.Counts
	entries int
}

func stateOf(t *testing.T, db *postgres.DB, sku string) state {
	t.Helper()
	return state{total(t, db, sku), len(ledgerEntries(t, db, sku))}
}

// TestShard_KeyReused: the same key on the same SKU with another quantity,
// kind or order ref is refused and changes nothing. (On another SKU it is
// another operation: TestShard_KeyScope.)
func TestShard_KeyReused(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, _ := openDB(t)
	createSKU(t, db, stock.SKU{Name: "reuse-a", Shards: 2}, 100)
	s := newServer(t, db, "a")
	acquire(t, s, "reuse-a", 1, 0, 1)
	ctx := context.Background()
	first := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a"}, Quantity: 2, Key: "k-1"})
	if first.Err != nil {
		t.Fatalf("Deduct = %v", first.Err)
	}
	before := map[string]state{"reuse-a": stateOf(t, db, "reuse-a")}
	for name, r := range map[string]*stock.Request{
		"OtherQuantity":      {Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a"}, Quantity: 3, Key: "k-1"},
		"OtherKind":          {Kind: stock.OpReserve, Shard: stock.ShardKey{SKU: "reuse-a"}, Quantity: 2, Key: "k-1"},
		"OtherShard":         {Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a", Index: 1}, Quantity: 3, Key: "k-1"},
		"OtherOrderRef":      {Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a"}, Quantity: 2, Key: "k-1", OrderRef: "o-9"},
		"InOneBatchOtherQty": nil,
	} {
		t.Run(name, func(t *testing.T) {
			var res stock.Result
			if r == nil { // two requests with one key in one call: the second differs
				rs := s.DoAll(ctx, []*stock.Request{
					{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a"}, Quantity: 1, Key: "k-2"},
					{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a"}, Quantity: 5, Key: "k-2"},
				})
				if rs[0].Err != nil {
					t.Fatalf("first of the batch = %v", rs[0].Err)
				}
				before["reuse-a"] = stateOf(t, db, "reuse-a")
				res = rs[1]
			} else {
				res = s.Do(ctx, r)
			}
			if res.Err == nil || res.Err.Code != stock.CodeIdempotencyKeyReused {
				t.Errorf("Do = %+v, want IDEMPOTENCY_KEY_REUSED", res)
			}
			for sku, st := range before {
				if got := stateOf(t, db, sku); got != st {
					t.Errorf("%s changed: %+v -> %+v", sku, st, got)
				}
			}
		})
	}
	replay := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "reuse-a", Index: 1}, Quantity: 2, Key: "k-1"})
	if replay.Err != nil || !replay.Replayed || replay.Operation.Shard != 0 {
		t.Errorf("retry on another shard = %+v, want a replay of shard 0's result", replay)
	}
	reconcile(t, db, "reuse-a")
}

// TestShard_InvalidInput: bad input gets its documented code and changes
// nothing.
func TestShard_InvalidInput(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, _ := openDB(t)
	const sku = "valid-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1, MaxPerOrder: 5}, 100)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0)
	sh := stock.ShardKey{SKU: sku}
	deduct := func(q int64, k string) *stock.Request {
		return &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: q, Key: k}
	}
	before := stateOf(t, db, sku)
	for _, tc := range []struct {
		name string
		req  *stock.Request
		want stock.Code
	}{
		{"QuantityZero", deduct(0, "k"), stock.CodeInvalidQuantity},
		{"QuantityNegative", deduct(-3, "k"), stock.CodeInvalidQuantity},
		{"QuantityAboveMaxPerOrder", deduct(6, "k"), stock.CodeQuantityAboveMaxPerOrder},
		{"QuantityAboveMaximum", deduct(stock.QuantityMax+1, "k"), stock.CodeInvalidQuantity},
		{"KeyEmpty", deduct(1, ""), stock.CodeInvalidIdempotencyKey},
		{"KeyTooLong", deduct(1, strings.Repeat("k", stock.IdempotencyKeyLenMax+1)), stock.CodeInvalidIdempotencyKey},
		{"KeyControlCharacter", deduct(1, "k\x00y"), stock.CodeInvalidIdempotencyKey},
		{"KeySpace", deduct(1, "k y"), stock.CodeInvalidIdempotencyKey},
		{"SKUEmpty", &stock.Request{Kind: stock.OpDeduct, Quantity: 1, Key: "k"}, stock.CodeInvalidSKU},
		{"SKUTooLong", &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: strings.Repeat("s", stock.SKULenMax+1)}, Quantity: 1, Key: "k"}, stock.CodeInvalidSKU},
		{"SKUControlCharacter", &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "sku\n1"}, Quantity: 1, Key: "k"}, stock.CodeInvalidSKU},
		{"OrderRefControlCharacter", &stock.Request{Kind: stock.OpDeduct, Shard: sh, Quantity: 1, Key: "k", OrderRef: "o\x1b"}, stock.CodeInvalidArgument},
		{"TTLTooLong", &stock.Request{Kind: stock.OpReserve, Shard: sh, Quantity: 1, Key: "k", TTL: stock.ReservationTTLMax * 2}, stock.CodeInvalidArgument},
		{"ReservationIDGarbage", &stock.Request{Kind: stock.OpCommit, Shard: sh, ReservationID: "nope"}, stock.CodeReservationNotFound},
		{"AdjustWithoutApprover", &stock.Request{Kind: stock.OpAdjust, Shard: sh, Quantity: 5, Key: "k", Reason: "count"}, stock.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := s.Do(context.Background(), tc.req)
			if res.Err == nil || res.Err.Code != tc.want {
				t.Errorf("Do(%+v) = %+v, want %s", tc.req, res, tc.want)
			}
			if got := stateOf(t, db, sku); got != before {
				t.Errorf("state changed: %+v -> %+v", before, got)
			}
		})
	}
	t.Run("UnknownSKU", func(t *testing.T) {
		acquire(t, s, "no-such-sku", 1, 0)
		res := s.Do(context.Background(), &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "no-such-sku"}, Quantity: 1, Key: "k"})
		if res.Err == nil || res.Err.Code != stock.CodeSKUNotFound {
			t.Errorf("Do = %+v, want SKU_NOT_FOUND", res)
		}
		res = s.Do(context.Background(), &stock.Request{Kind: stock.OpCommit, Shard: stock.ShardKey{SKU: "no-such-sku"}, ReservationID: "r-1"})
		if res.Err == nil || res.Err.Code != stock.CodeReservationNotFound {
			t.Errorf("Commit on an unknown SKU = %+v, want RESERVATION_NOT_FOUND", res)
		}
		// A writer that found no shard row is gone: once the SKU exists,
		// its shard serves (the first batch reads the row it creates).
		createSKU(t, db, stock.SKU{Name: "no-such-sku", Shards: 1}, 2)
		res = s.Do(context.Background(), &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: "no-such-sku"}, Quantity: 2, Key: "late-k"})
		if res.Err != nil || res.Available != 0 {
			t.Errorf("Do after CreateSKU = %+v, want a deduct leaving 0", res)
		}
	})
	t.Run("ShardBeyondTheSKU", func(t *testing.T) {
		acquire(t, s, sku, 2, 7)
		res := s.Do(context.Background(), &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: 7}, Quantity: 1, Key: "k"})
		if res.Err == nil || res.Err.Code != stock.CodeSKUNotFound {
			t.Errorf("Do on shard 7 = %+v, want SKU_NOT_FOUND", res)
		}
	})
	t.Run("KeyStaysFreeAfterRefusal", func(t *testing.T) {
		res := s.Do(context.Background(), deduct(1, "k"))
		if res.Err != nil || res.Replayed {
			t.Errorf("Do after refusals = %+v, want a first success (refusals write no operation)", res)
		}
	})
}

// TestShard_Limits: max_per_order, customer_limit and pause.
func TestShard_Limits(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, _ := openDB(t)
	const sku = "limit-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 2, CustomerLimit: 3}, 100)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0, 1)
	ctx := context.Background()
	do := func(kind stock.OpKind, idx int32, q int64, k, customer string) stock.Result {
		return s.Do(ctx, &stock.Request{Kind: kind, Shard: stock.ShardKey{SKU: sku, Index: idx}, Quantity: q, Key: k, CustomerRef: customer})
	}
	if res := do(stock.OpDeduct, 0, 2, "c1-a", "alice"); res.Err != nil {
		t.Fatalf("first deduct = %v", res.Err)
	}
	if res := do(stock.OpReserve, 1, 2, "c1-b", "alice"); res.Err == nil || res.Err.Code != stock.CodeCustomerLimitReached {
		t.Errorf("deduct over the limit on another shard = %+v, want CUSTOMER_LIMIT_REACHED", res)
	}
	held := do(stock.OpReserve, 1, 1, "c1-c", "alice")
	if held.Err != nil {
		t.Fatalf("reserve up to the limit = %v", held.Err)
	}
	if res := s.Do(ctx, &stock.Request{Kind: stock.OpRelease, Shard: stock.ShardKey{SKU: sku, Index: 1}, ReservationID: held.Reservation.ID}); res.Err != nil {
		t.Fatalf("release = %v", res.Err)
	}
	if res := do(stock.OpDeduct, 1, 1, "c1-d", "alice"); res.Err != nil {
		t.Errorf("deduct after a release gave the unit back = %v, want success", res.Err)
	}
	if res := do(stock.OpDeduct, 0, 3, "c2-a", "bob"); res.Err != nil {
		t.Errorf("another customer = %v", res.Err)
	}

	paused := true
	if _, err := db.UpdateSKU(ctx, sku, stock.SKUUpdate{Paused: &paused}); err != nil {
		t.Fatal(err)
	}
	before := stateOf(t, db, sku)
	for _, kind := range []stock.OpKind{stock.OpReserve, stock.OpDeduct} {
		if res := do(kind, 0, 1, "p-"+string(kind), ""); res.Err == nil || res.Err.Code != stock.CodeSKUPaused {
			t.Errorf("%s on a paused sku = %+v, want SKU_PAUSED", kind, res)
		}
	}
	if got := stateOf(t, db, sku); got != before {
		t.Errorf("paused sku changed: %+v -> %+v", before, got)
	}
	if res := do(stock.OpReplenish, 0, 4, "refund-1", ""); res.Err != nil {
		t.Errorf("replenish on a paused sku = %v, want success", res.Err)
	}
	if res := do(stock.OpReplenish, 0, 4, "refund-1", ""); res.Err != nil || !res.Replayed {
		t.Errorf("replenish retry = %+v, want a replay", res)
	}
	if c := total(t, db, sku); c != (stock.Counts{Available: 100 - 6 + 4, Sold: 6}) {
		t.Errorf("total = %+v, want available 98, sold 6", c)
	}
	reconcile(t, db, sku)
}

// TestShard_Ceiling: a shard holding stock.ShardCountMax (available plus
// reserved) takes nothing more in. A replenish, a positive adjustment or a
// transfer to it that would pass the ceiling is refused INVALID_QUANTITY
// and changes nothing (row, ledger, operations, transfers); up to the
// ceiling is accepted, and what takes stock out still works.
func TestShard_Ceiling(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	db, url := openDB(t)
	const sku = "ceiling-sku"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 2}, 20) // 10 and 10
	// Shard 0 starts 5 below the ceiling, set before any writer has a copy
	// of its row; through the API it takes a thousand maximal adjustments.
	// Its opening balance moves with it, so the books still reconcile.
	tamper(t, url, `UPDATE shards SET available = $2, opening_available = $2 WHERE sku = $1 AND idx = 0`, sku, int64(stock.ShardCountMax)-5)
	s := newServer(t, db, "a")
	acquire(t, s, sku, 1, 0, 1)
	ctx := context.Background()
	sh0 := stock.ShardKey{SKU: sku, Index: 0}
	// A hold counts against the ceiling: 2 reserved, ShardCountMax-7
	// available, room for 5.
	hold := s.Do(ctx, &stock.Request{Kind: stock.OpReserve, Shard: sh0, Quantity: 2, Key: "hold-2"})
	if hold.Err != nil {
		t.Fatalf("Do(reserve 2) = %v", hold.Err)
	}
	replenish := func(key string, q int64) *stock.Request {
		return &stock.Request{Kind: stock.OpReplenish, Shard: sh0, Quantity: q, Key: key}
	}
	transfer := func(q int64) error {
		return db.CreateTransfer(ctx, &stock.Transfer{ID: stock.NewTransferID(), SKU: sku, From: 1, To: 0, Quantity: q, Reason: "test"})
	}
	// refused checks that r is refused INVALID_QUANTITY (r nil: a transfer
	// of q from shard 1) and that nothing changed.
	refused := func(t *testing.T, r *stock.Request, q int64) {
		t.Helper()
		before := stateOf(t, db, sku)
		if r == nil {
			if err := transfer(q); stock.CodeOf(err) != stock.CodeInvalidQuantity {
				t.Errorf("CreateTransfer(%d from shard 1 to shard 0) = %v, want INVALID_QUANTITY", q, err)
			}
		} else {
			if res := s.Do(ctx, r); res.Err == nil || res.Err.Code != stock.CodeInvalidQuantity {
				t.Errorf("Do(%s %d on shard 0) = %+v, want INVALID_QUANTITY", r.Kind, r.Quantity, res)
			}
			if _, err := db.GetOperation(ctx, sku, r.Key); stock.CodeOf(err) != stock.CodeOperationNotFound {
				t.Errorf("GetOperation(%s) after the refusal = %v, want OPERATION_NOT_FOUND", r.Key, err)
			}
		}
		if got := stateOf(t, db, sku); got != before {
			t.Errorf("state after the refusal = %+v, want %+v", got, before)
		}
		if ts, err := db.ListTransfers(ctx, stock.TransferFilter{SKU: sku}, "", 10); err != nil || len(ts) != 0 {
			t.Errorf("ListTransfers(%s) = %d transfers, %v, want none", sku, len(ts), err)
		}
	}

	t.Run("Replenish", func(t *testing.T) { refused(t, replenish("r-6", 6), 0) })
	t.Run("Adjust", func(t *testing.T) {
		refused(t, &stock.Request{Kind: stock.OpAdjust, Shard: sh0, Quantity: 6, Key: "a-6", Reason: "recount", Approver: "alice"}, 0)
	})
	t.Run("TransferIn", func(t *testing.T) { refused(t, nil, 6) })
	t.Run("UpToCeiling", func(t *testing.T) {
		if res := s.Do(ctx, replenish("r-5", 5)); res.Err != nil {
			t.Fatalf("Do(replenish 5) with room for 5 = %v, want success", res.Err)
		}
		rows, err := db.Shards(ctx, sku)
		if err != nil || rows[0].Available+rows[0].Reserved != stock.ShardCountMax {
			t.Fatalf("Shards(%s) = %+v, %v, want shard 0 holding %d", sku, rows, err, int64(stock.ShardCountMax))
		}
		refused(t, replenish("r-1", 1), 0)
		refused(t, nil, 1)
	})
	t.Run("StillTakesOut", func(t *testing.T) {
		if res := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: sh0, Quantity: 1, Key: "d-1"}); res.Err != nil {
			t.Errorf("Do(deduct 1) at the ceiling = %v, want success", res.Err)
		}
		if res := s.Do(ctx, &stock.Request{Kind: stock.OpCommit, Shard: sh0, ReservationID: hold.Reservation.ID}); res.Err != nil {
			t.Errorf("Do(commit) at the ceiling = %v, want success", res.Err)
		}
		// 3 units left the shard: room for 3 again.
		if res := s.Do(ctx, replenish("r-3", 3)); res.Err != nil {
			t.Errorf("Do(replenish 3) with room for 3 = %v, want success", res.Err)
		}
	})
	reconcile(t, db, sku)
}

// TestShard_ConfigChangedElsewhere: a writer's copy of the SKU is as of
// its last batch, and another process (an allocator's UpdateSku) may change
// the SKU meanwhile. A request larger than the shard holds is refused
// without a transaction (the read-only path), and that refusal must be
// for stock, never by the SKU's configuration as the writer last saw it:
// an allocator moves on from OUT_OF_STOCK ("not enough here") and
// consolidates, but takes SKU_PAUSED as final, and a SKU resumed elsewhere
// would be refused for as long as the writer lives.
func TestShard_ConfigChangedElsewhere(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	one, none := int64(1), int64(0)
	paused, active := true, false
	for _, tc := range []struct {
		name          string
		before, after stock.SKUUpdate
		code          stock.Code // the refusal before the change
	}{
		{"Resumed", stock.SKUUpdate{Paused: &paused}, stock.SKUUpdate{Paused: &active}, stock.CodeSKUPaused},
		{"MaxPerOrderLifted", stock.SKUUpdate{MaxPerOrder: &one}, stock.SKUUpdate{MaxPerOrder: &none}, stock.CodeQuantityAboveMaxPerOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, _ := openDB(t)
			sku := "elsewhere-" + strings.ToLower(tc.name)
			createSKU(t, db, stock.SKU{Name: sku, Shards: 2}, 2) // one unit on each shard
			s := newServer(t, db, "a")
			acquire(t, s, sku, 1, 0, 1)
			ctx := context.Background()
			deduct := func(q int64, key string) stock.Result {
				return s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku, Index: 0}, Quantity: q, Key: key})
			}
			if _, err := db.UpdateSKU(ctx, sku, tc.before); err != nil {
				t.Fatal(err)
			}
			// Shard 0's writer reads the SKU as changed, and its row (one
			// unit): what its read-only path decides from.
			if res := deduct(2, "before"); res.Err == nil || res.Err.Code != tc.code {
				t.Fatalf("deduct 2 before the change = %+v, want %s", res, tc.code)
			}
			if _, err := db.UpdateSKU(ctx, sku, tc.after); err != nil {
				t.Fatal(err)
			}
			before := stateOf(t, db, sku)
			if res := deduct(2, "after"); res.Err == nil || res.Err.Code != stock.CodeOutOfStock || res.Available != 1 {
				t.Errorf("deduct 2 (more than the shard holds) after the change = %+v, want OUT_OF_STOCK with 1 available", res)
			}
			if got := stateOf(t, db, sku); got != before {
				t.Errorf("a refused deduct changed the shard: %+v -> %+v", before, got)
			}
			if res := deduct(1, "fits"); res.Err != nil {
				t.Errorf("deduct 1 after the change = %v, want success", res.Err)
			}
			reconcile(t, db, sku)
		})
	}
}
