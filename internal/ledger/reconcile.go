// Package ledger keeps the books: what a SKU's ledger means and how it is
// read. Check proves a SKU's books balance: a pure function of a Snapshot
// that the Postgres adapter reads in one repeatable-read transaction,
// starting at each shard's latest checkpoint; it returns every discrepancy
// it finds, not only the first. The scheduler reconciles every SKU in turn.
package ledger

import (
	"fmt"
	"slices"

	"github.com/shardstock/shardstock/internal/stock"
)

// Snapshot is what reconciliation needs of one SKU, read at one instant.
type Snapshot struct {
	SKU    string
	Shards []Shard
	// KeyedMismatches lists idempotency keys whose operations and keyed
	// ledger entries do not pair one to one (an operation with no entry, an
	// entry with no operation, or two entries for one key).
	KeyedMismatches []KeyMismatch
	// EndMismatches lists reservations whose end state and end entries do
	// not pair (a committed reservation needs exactly one commit entry, and
	// so on; a held one none).
	EndMismatches []EndMismatch
	// TransferMismatches lists transfers whose state and ledger entries do
	// not pair (debited: one transfer_out; credited: one transfer_out and
	// one transfer_in; pending or aborted: none).
	TransferMismatches []TransferMismatch
	// InTransit is stock debited from one shard and not yet credited to
	// another.
	InTransit int64
}

// TransferMismatch is one transfer whose state and entries do not pair.
type TransferMismatch struct {
	TransferID string
	State      stock.TransferState
	Outs, Ins  int64
}

// Shard is one shard's row, opening balance, latest checkpoint, the sums
// of its entries after that checkpoint and its held holds.
type Shard struct {
	Index   int32
	Row     stock.Counts
	Opening stock.Counts
	// Checkpoint is the shard's latest checkpoint; nil: it has none, and
	// its entries start from Opening.
	Checkpoint *Checkpoint
	// Kinds sums the shard's entries after its checkpoint by kind.
	Kinds map[stock.OpKind]KindSum
	// BrokenChain counts entries whose before/after do not match the
	// previous entry's after (the ledger is a chain per shard, from its
	// opening balance or its checkpoint).
	BrokenChain int64
	// HeldReserved is the sum of the shard's held reservations.
	HeldReserved int64
	// Unsound is the stretch of the shard's ledger that the walk of
	// scheduled reconciliation found wrong, as recorded; nil: none.
	Unsound *Unsound
}

// KindSum is the sum of one kind of ledger entry on one shard.
type KindSum struct {
	Entries  int64
	Quantity int64
	Delta    stock.Counts // sum of after - before
}

// KeyMismatch is one key whose operation and ledger entries do not pair.
type KeyMismatch struct {
	Key        string
	Operations int64
	Entries    int64
}

// EndMismatch is one reservation whose end and end entries do not pair.
type EndMismatch struct {
	ReservationID string
	State         stock.ReservationState
	Entries       int64
}

// Discrepancy is one thing that does not balance.
type Discrepancy struct {
	Check    string
	Shard    int32 // -1 for the whole SKU
	Detail   string
	Expected int64
	Actual   int64
}

// Checks, as named in discrepancies.
const (
	CheckShardBalance    = "shard_balance"
	CheckEntryDelta      = "entry_delta"
	CheckChain           = "ledger_chain"
	CheckOperationLedger = "operation_ledger"
	CheckReservationEnd  = "reservation_end"
	CheckTransfer        = "transfer"
	CheckReservedHolds   = "reserved_holds"
	CheckConservation    = "conservation"
	CheckNegative        = "negative"
	// CheckWalk: a stretch between two checkpoints (Stretch), its
	// received, or the record of one found wrong (Shard.Unsound).
	CheckWalk = "ledger_walk"
)

// adder records one discrepancy.
type adder func(check string, shard int32, exp, act int64, format string, args ...any)

// Check checks a snapshot: per shard, opening balance (or the latest
// checkpoint) plus the deltas of the entries after it equals the row, every entry moves the counts its kind says, the chain of
// before/after is unbroken, and held reservations sum to reserved; per SKU,
// operations and ledger entries pair one to one, every ended reservation has
// one end entry, and available + reserved + sold + in transit equals what
// was received, replenished and adjusted.
func Check(s Snapshot) []Discrepancy {
	ds, add := discrepancies()
	var total stock.Counts
	var received int64 // opening stock and inflow before each checkpoint
	var inflow int64   // after it
	for _, sh := range s.Shards {
		if !sh.Row.Valid() {
			add(CheckNegative, sh.Index, 0, min(sh.Row.Available, sh.Row.Reserved, sh.Row.Sold), "shard has a negative count %+v", sh.Row)
		}
		start, shardReceived := startOf(sh.Opening, sh.Checkpoint)
		received += shardReceived
		inflow += checkEntries(add, sh.Index, start, sh.Kinds, sh.BrokenChain, sh.Row, "row")
		if u := sh.Unsound; u != nil {
			add(CheckWalk, sh.Index, 0, u.To, "the stretch of entries up to %d was found wrong: %s", u.To, u.Detail)
		}
		if sh.HeldReserved != sh.Row.Reserved {
			add(CheckReservedHolds, sh.Index, sh.HeldReserved, sh.Row.Reserved, "held reservations sum to %d, reserved is %d", sh.HeldReserved, sh.Row.Reserved)
		}
		total = total.Add(sh.Row)
	}
	for _, m := range s.KeyedMismatches {
		add(CheckOperationLedger, -1, m.Operations, m.Entries, "key %q: %d operations, %d ledger entries", m.Key, m.Operations, m.Entries)
	}
	for _, m := range s.EndMismatches {
		add(CheckReservationEnd, -1, endEntriesWant(m.State), m.Entries, "reservation %s is %s with %d end entries", m.ReservationID, m.State, m.Entries)
	}
	for _, m := range s.TransferMismatches {
		add(CheckTransfer, -1, 0, 0, "transfer %s is %s with %d transfer_out and %d transfer_in entries", m.TransferID, m.State, m.Outs, m.Ins)
	}
	have := total.Available + total.Reserved + total.Sold + s.InTransit
	received += inflow
	if have != received {
		add(CheckConservation, -1, received, have, "available+reserved+sold+in_transit = %d, received+replenished+adjusted = %d", have, received)
	}
	return *ds
}

// discrepancies returns a list and the adder that appends to it.
func discrepancies() (*[]Discrepancy, adder) {
	ds := new([]Discrepancy)
	return ds, func(check string, shard int32, exp, act int64, format string, args ...any) {
		*ds = append(*ds, Discrepancy{Check: check, Shard: shard, Expected: exp, Actual: act, Detail: fmt.Sprintf(format, args...)})
	}
}

// startOf is where a shard's entries after cp start: cp's counts and
// received, or with no checkpoint the shard's opening balance.
func startOf(opening stock.Counts, cp *Checkpoint) (stock.Counts, int64) {
	if cp != nil {
		return cp.Counts, cp.Received
	}
	return opening, opening.Available + opening.Reserved + opening.Sold
}

// checkEntries checks a run of one shard's entries from start (kinds
// sums them by kind; brokenChain counts the links of their chain that do
// not hold): every kind moves the counts it says, the chain holds, and
// start plus the entries is end (endName says what end is). It returns
// the stock the entries brought in: replenishes and adjustments.
func checkEntries(add adder, index int32, start stock.Counts, kinds map[stock.OpKind]KindSum, brokenChain int64,
	end stock.Counts, endName string) (inflow int64) {
	sum := start
	for _, kind := range sortedKinds(kinds) {
		k := kinds[kind]
		sum = sum.Add(k.Delta)
		if kind == stock.OpAdjust { // an adjustment's quantity is signed
			if k.Delta.Available != k.Quantity || k.Delta.Reserved != 0 || k.Delta.Sold != 0 {
				add(CheckEntryDelta, index, k.Quantity, k.Delta.Available, "adjust entries move %+v for quantity %d", k.Delta, k.Quantity)
			}
		} else if want := kind.Delta(k.Quantity); k.Delta != want {
			add(CheckEntryDelta, index, 0, 0, "%s entries move %+v, want %+v", kind, k.Delta, want)
		}
		if kind == stock.OpReplenish || kind == stock.OpAdjust {
			inflow += k.Delta.Available
		}
	}
	compare := func(name string, exp, act int64) {
		if exp != act {
			add(CheckShardBalance, index, exp, act, "%s: start + ledger = %d, %s = %d", name, exp, endName, act)
		}
	}
	compare("available", sum.Available, end.Available)
	compare("reserved", sum.Reserved, end.Reserved)
	compare("sold", sum.Sold, end.Sold)
	if brokenChain > 0 {
		add(CheckChain, index, 0, brokenChain, "%d entries do not start where the previous one ended", brokenChain)
	}
	return inflow
}

func endEntriesWant(st stock.ReservationState) int64 {
	if st == stock.ReservationHeld {
		return 0
	}
	return 1
}

func sortedKinds(m map[stock.OpKind]KindSum) []stock.OpKind {
	ks := make([]stock.OpKind, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
