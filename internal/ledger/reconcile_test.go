package ledger_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
)

// balanced returns a snapshot of two shards whose books balance: shard 0
// opened with 100 and saw every kind of entry; shard 1 opened with 50 and
// saw none. Each call returns fresh maps, so cases may change them.
func balanced() ledger.Snapshot {
	return ledger.Snapshot{
		SKU: "sku-1",
		Shards: []ledger.Shard{
			{
				Index:   0,
				Opening: stock.Counts{Available: 100},
				Kinds: map[stock.OpKind]ledger.KindSum{
					stock.OpReserve:   {Entries: 2, Quantity: 10, Delta: stock.Counts{Available: -10, Reserved: 10}},
					stock.OpCommit:    {Entries: 1, Quantity: 4, Delta: stock.Counts{Reserved: -4, Sold: 4}},
					stock.OpRelease:   {Entries: 1, Quantity: 3, Delta: stock.Counts{Available: 3, Reserved: -3}},
					stock.OpExpire:    {Entries: 1, Quantity: 1, Delta: stock.Counts{Available: 1, Reserved: -1}},
					stock.OpDeduct:    {Entries: 1, Quantity: 5, Delta: stock.Counts{Available: -5, Sold: 5}},
					stock.OpReplenish: {Entries: 1, Quantity: 20, Delta: stock.Counts{Available: 20}},
					stock.OpAdjust:    {Entries: 1, Quantity: -2, Delta: stock.Counts{Available: -2}},
				},
				// 100 - 10 + 3 + 1 - 5 + 20 - 2; 10 - 4 - 3 - 1; 4 + 5
				Row:          stock.Counts{Available: 107, Reserved: 2, Sold: 9},
				HeldReserved: 2,
			},
			{
				Index:   1,
				Opening: stock.Counts{Available: 50},
				Row:     stock.Counts{Available: 50},
			},
		},
	}
}

// found is one discrepancy as the table compares it.
type found struct {
	Check            string
	Shard            int32
	Expected, Actual int64
}

func (f found) String() string {
	return fmt.Sprintf("%s@%d(%d/%d)", f.Check, f.Shard, f.Expected, f.Actual)
}

func summarise(ds []ledger.Discrepancy) []found {
	out := make([]found, len(ds))
	for i, d := range ds {
		out[i] = found{d.Check, d.Shard, d.Expected, d.Actual}
	}
	slices.SortFunc(out, func(a, b found) int { return strings.Compare(a.String(), b.String()) })
	return out
}

func TestReconcile(t *testing.T) {
	tests := []struct {
		name  string
		fault func(s *ledger.Snapshot)
		want  []found
		// detail, if set, must appear in the first discrepancy's detail.
		detail string
	}{
		{
			name:  "OK",
			fault: func(*ledger.Snapshot) {},
		},
		{
			name:  "NoEntries",
			fault: func(s *ledger.Snapshot) { s.Shards = s.Shards[1:] },
		},
		{
			name:  "ShardBalanceAvailable",
			fault: func(s *ledger.Snapshot) { s.Shards[0].Row.Available++ },
			want: []found{
				{ledger.CheckConservation, -1, 168, 169},
				{ledger.CheckShardBalance, 0, 107, 108},
			},
			detail: "available:",
		},
		{
			name: "ShardBalanceReserved",
			fault: func(s *ledger.Snapshot) {
				s.Shards[0].Row.Reserved++
				s.Shards[0].HeldReserved++ // the holds agree with the row, not with the ledger
			},
			want: []found{
				{ledger.CheckConservation, -1, 168, 169},
				{ledger.CheckShardBalance, 0, 2, 3},
			},
			detail: "reserved:",
		},
		{
			name:  "ShardBalanceSold",
			fault: func(s *ledger.Snapshot) { s.Shards[0].Row.Sold++ },
			want: []found{
				{ledger.CheckConservation, -1, 168, 169},
				{ledger.CheckShardBalance, 0, 9, 10},
			},
			detail: "sold:",
		},
		{
			name: "ShardBalanceMoved",
			// A unit moved from available to sold without an entry: the SKU
			// still conserves, only the shard's balance is off, twice.
			fault: func(s *ledger.Snapshot) {
				s.Shards[0].Row.Available--
				s.Shards[0].Row.Sold++
			},
			want: []found{
				{ledger.CheckShardBalance, 0, 107, 106},
				{ledger.CheckShardBalance, 0, 9, 10},
			},
		},
		{
			name: "EntryDelta",
			// Commit entries that moved a unit to available instead of sold,
			// with the row agreeing: only the entries' shape is wrong.
			fault: func(s *ledger.Snapshot) {
				s.Shards[0].Kinds[stock.OpCommit] = ledger.KindSum{Entries: 1, Quantity: 4, Delta: stock.Counts{Available: 1, Reserved: -4, Sold: 3}}
				s.Shards[0].Row.Available++
				s.Shards[0].Row.Sold--
			},
			want:   []found{{ledger.CheckEntryDelta, 0, 0, 0}},
			detail: "commit",
		},
		{
			name: "EntryDeltaAdjust",
			// An adjustment of -2 that removed 3.
			fault: func(s *ledger.Snapshot) {
				s.Shards[0].Kinds[stock.OpAdjust] = ledger.KindSum{Entries: 1, Quantity: -2, Delta: stock.Counts{Available: -3}}
				s.Shards[0].Row.Available--
			},
			want:   []found{{ledger.CheckEntryDelta, 0, -2, -3}},
			detail: "adjust",
		},
		{
			name:  "LedgerChain",
			fault: func(s *ledger.Snapshot) { s.Shards[0].BrokenChain = 2 },
			want:  []found{{ledger.CheckChain, 0, 0, 2}},
		},
		{
			name: "OperationLedger",
			fault: func(s *ledger.Snapshot) {
				s.KeyedMismatches = []ledger.KeyMismatch{{Key: "k-1", Operations: 1, Entries: 0}}
			},
			want:   []found{{ledger.CheckOperationLedger, -1, 1, 0}},
			detail: `"k-1"`,
		},
		{
			name: "ReservationEnd",
			fault: func(s *ledger.Snapshot) {
				s.EndMismatches = []ledger.EndMismatch{{ReservationID: "r-1", State: stock.ReservationCommitted, Entries: 0}}
			},
			want:   []found{{ledger.CheckReservationEnd, -1, 1, 0}},
			detail: "r-1",
		},
		{
			name: "ReservationEndHeld",
			fault: func(s *ledger.Snapshot) {
				s.EndMismatches = []ledger.EndMismatch{{ReservationID: "r-2", State: stock.ReservationHeld, Entries: 1}}
			},
			want: []found{{ledger.CheckReservationEnd, -1, 0, 1}},
		},
		{
			name:  "ReservedHolds",
			fault: func(s *ledger.Snapshot) { s.Shards[0].HeldReserved = 5 },
			want:  []found{{ledger.CheckReservedHolds, 0, 5, 2}},
		},
		{
			name:  "Conservation",
			fault: func(s *ledger.Snapshot) { s.InTransit = 4 }, // in transit out of nowhere
			want:  []found{{ledger.CheckConservation, -1, 168, 172}},
		},
		{
			name: "TwoShardsBalanced",
			// Entries on both shards, each balancing: nothing to report.
			fault: func(s *ledger.Snapshot) {
				s.Shards[1].Kinds = map[stock.OpKind]ledger.KindSum{stock.OpDeduct: {Entries: 1, Quantity: 5, Delta: stock.Counts{Available: -5, Sold: 5}}}
				s.Shards[1].Row = stock.Counts{Available: 45, Sold: 5}
			},
		},
		{
			name: "Negative",
			// A shard whose ledger agrees with its negative row: only the
			// sign is wrong.
			fault: func(s *ledger.Snapshot) {
				s.Shards[1].Opening = stock.Counts{}
				s.Shards[1].Kinds = map[stock.OpKind]ledger.KindSum{stock.OpDeduct: {Entries: 1, Quantity: 1, Delta: stock.Counts{Available: -1, Sold: 1}}}
				s.Shards[1].Row = stock.Counts{Available: -1, Sold: 1}
			},
			want: []found{{ledger.CheckNegative, 1, 0, -1}},
		},
		{
			name: "All",
			fault: func(s *ledger.Snapshot) {
				s.Shards[0].Row.Available++
				s.Shards[0].BrokenChain = 1
				s.Shards[0].HeldReserved = 1
				s.Shards[1].Kinds = map[stock.OpKind]ledger.KindSum{stock.OpReplenish: {Entries: 1, Quantity: 5, Delta: stock.Counts{Available: 4}}}
				s.Shards[1].Row = stock.Counts{Available: 54}
				s.KeyedMismatches = []ledger.KeyMismatch{{Key: "k-1", Operations: 1}, {Key: "k-2", Entries: 2}}
				s.EndMismatches = []ledger.EndMismatch{{ReservationID: "r-1", State: stock.ReservationReleased}}
			},
			want: []found{
				{ledger.CheckConservation, -1, 172, 173},
				{ledger.CheckEntryDelta, 1, 0, 0},
				{ledger.CheckChain, 0, 0, 1},
				{ledger.CheckOperationLedger, -1, 0, 2},
				{ledger.CheckOperationLedger, -1, 1, 0},
				{ledger.CheckReservationEnd, -1, 1, 0},
				{ledger.CheckReservedHolds, 0, 1, 2},
				{ledger.CheckShardBalance, 0, 107, 108},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := balanced()
			tt.fault(&snap)
			ds := ledger.Check(snap)
			got, want := summarise(ds), tt.want
			slices.SortFunc(want, func(a, b found) int { return strings.Compare(a.String(), b.String()) })
			if !slices.Equal(got, want) {
				t.Errorf("Check(%s) = %v, want %v", tt.name, got, want)
			}
			for _, d := range ds {
				if d.Detail == "" {
					t.Errorf("Check(%s): discrepancy %+v has no detail", tt.name, d)
				}
			}
			if tt.detail != "" && len(ds) > 0 {
				if !slices.ContainsFunc(ds, func(d ledger.Discrepancy) bool { return strings.Contains(d.Detail, tt.detail) }) {
					t.Errorf("Check(%s) details = %+v, want one mentioning %q", tt.name, ds, tt.detail)
				}
			}
		})
	}
}

// TestReconcile_Pure: Check neither changes its snapshot nor depends on map
// order (it runs many times with the same answer). The snapshot has a fault
// in every part, so that Check walks all of it, and every field of every
// shard and of the SKU is compared with an untouched copy afterwards.
func TestReconcile_Pure(t *testing.T) {
	faulty := func() ledger.Snapshot {
		s := balanced()
		s.Shards[0].Row.Available++
		s.Shards[0].BrokenChain = 1
		s.Shards[1].Kinds = map[stock.OpKind]ledger.KindSum{
			stock.OpDeduct:    {Entries: 1, Quantity: 5, Delta: stock.Counts{Available: -5, Sold: 5}},
			stock.OpReplenish: {Entries: 1, Quantity: 5, Delta: stock.Counts{Available: 4}},
		}
		s.Shards[1].HeldReserved = 3
		s.KeyedMismatches = []ledger.KeyMismatch{{Key: "k-2", Entries: 2}, {Key: "k-1", Operations: 1}}
		s.EndMismatches = []ledger.EndMismatch{{ReservationID: "r-2", State: stock.ReservationHeld, Entries: 1}, {ReservationID: "r-1", State: stock.ReservationReleased}}
		s.TransferMismatches = []ledger.TransferMismatch{{TransferID: "t-2", State: stock.TransferCredited, Outs: 1}, {TransferID: "t-1", State: stock.TransferPending, Ins: 1}}
		s.InTransit = 2
		return s
	}
	snap, want := faulty(), faulty()
	first := ledger.Check(snap)
	for range 20 {
		if got := ledger.Check(snap); !slices.Equal(got, first) {
			t.Fatalf("Check(same snapshot) = %+v, want %+v", got, first)
		}
	}
	if len(first) == 0 {
		t.Fatal("Check(faulty snapshot) found nothing: the snapshot does not exercise it")
	}
	if len(snap.Shards) != len(want.Shards) {
		t.Fatalf("Check changed its snapshot's shards: %d, want %d", len(snap.Shards), len(want.Shards))
	}
	for i := range want.Shards {
		if !reflect.DeepEqual(snap.Shards[i], want.Shards[i]) {
			t.Errorf("Check changed shard %d: %+v, want %+v", i, snap.Shards[i], want.Shards[i])
		}
	}
	sku, wantSKU := snap, want // the SKU's own fields, the shards compared above
	sku.Shards, wantSKU.Shards = nil, nil
	if !reflect.DeepEqual(sku, wantSKU) {
		t.Errorf("Check changed its snapshot: %+v, want %+v", sku, wantSKU)
	}
}

// TestCheckStretch: a stretch balances from its start to its end
// checkpoint; a wrong end, a broken chain or a wrong received each show.
func TestCheckStretch(t *testing.T) {
	stretch := func() ledger.Stretch {
		// From a checkpoint at 100 received 100: 20 replenished, 5 deducted.
		return ledger.Stretch{
			Index: 3,
			From:  &ledger.Checkpoint{EntryID: 10, Counts: stock.Counts{Available: 100}, Received: 100},
			To:    ledger.Checkpoint{EntryID: 40, Counts: stock.Counts{Available: 115, Sold: 5}, Received: 120},
			Kinds: map[stock.OpKind]ledger.KindSum{
				stock.OpReplenish: {Entries: 20, Quantity: 20, Delta: stock.Counts{Available: 20}},
				stock.OpDeduct:    {Entries: 5, Quantity: 5, Delta: stock.Counts{Available: -5, Sold: 5}},
			},
		}
	}
	for _, tt := range []struct {
		name  string
		fault func(st *ledger.Stretch)
		want  []found
	}{
		{name: "OK", fault: func(*ledger.Stretch) {}},
		{name: "FromOpening", fault: func(st *ledger.Stretch) { st.From, st.Opening = nil, stock.Counts{Available: 100} }},
		{name: "EndWrong", fault: func(st *ledger.Stretch) { st.To.Counts.Available = 116 }, want: []found{{ledger.CheckShardBalance, 3, 115, 116}}},
		{name: "BrokenChain", fault: func(st *ledger.Stretch) { st.BrokenChain = 1 }, want: []found{{ledger.CheckChain, 3, 0, 1}}},
		{name: "ReceivedWrong", fault: func(st *ledger.Stretch) { st.To.Received = 121 }, want: []found{{ledger.CheckWalk, 3, 120, 121}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := stretch()
			tt.fault(&st)
			if got := summarise(ledger.CheckStretch(st)); !slices.Equal(got, tt.want) {
				t.Errorf("CheckStretch(%s) = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}
