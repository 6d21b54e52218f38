package rebalance

import (
	"slices"
	"testing"
)

// known, halted and unknown build hints for the tables.
func known(available int64) Hint { return Hint{Available: available, Known: true} }

func halted(available int64) Hint { return Hint{Available: available, Known: true, Halted: true} }

var unknown = Hint{}

func skipOnly(idx ...int32) func(int32) bool {
	return func(i int32) bool { return slices.Contains(idx, i) }
}

func TestConsolidation(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hints      []Hint
		q          int64
		skip       func(int32) bool
		wantTarget int32
		wantMoves  []move
	}{
		{"NothingKnown", []Hint{unknown, unknown}, 1, nil, -1, nil},
		{"AllEmpty", []Hint{known(0), known(0)}, 1, nil, -1, nil},
		{"NotEnoughInTotal", []Hint{known(10), known(20), unknown}, 31, nil, -1, nil},
		{"OneSource", []Hint{known(10), known(30), known(20), unknown}, 50, nil, 1, []move{{from: 2, quantity: 20}}},
		{"MostFirstThenPart", []Hint{known(10), known(30), known(20)}, 55, nil, 1, []move{{from: 2, quantity: 20}, {from: 0, quantity: 5}}},
		{"ExactlyAll", []Hint{known(10), known(10), known(10)}, 30, nil, 0, []move{{from: 1, quantity: 10}, {from: 2, quantity: 10}}},
		{"TargetHoldsEnough", []Hint{known(40), known(10)}, 30, nil, 0, nil},
		{"SkippedNotTarget", []Hint{known(40), known(30), known(20)}, 45, skipOnly(0), 1, []move{{from: 2, quantity: 15}}},
		{"SkippedNotSource", []Hint{known(40), known(30), known(20)}, 75, skipOnly(2), -1, nil},
		{"HaltedNotTarget", []Hint{halted(40), known(10), known(10), known(10)}, 25, nil, 1, []move{{from: 2, quantity: 10}, {from: 3, quantity: 5}}},
		{"HaltedNotSource", []Hint{halted(40), known(10), known(10)}, 45, nil, -1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, moves := consolidation(tc.hints, int32(len(tc.hints)), tc.q, tc.skip)
			if target != tc.wantTarget || !slices.Equal(moves, tc.wantMoves) {
				t.Errorf("consolidation(%v, %d) = %d, %v, want %d, %v", tc.hints, tc.q, target, moves, tc.wantTarget, tc.wantMoves)
			}
		})
	}
}

// Shards being retired (index at or above serving) give but never receive.
func TestConsolidation_Retiring(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hints      []Hint
		serving    int32
		q          int64
		wantTarget int32
		wantMoves  []move
	}{
		{"FromRetiring", []Hint{known(5), known(0), known(30)}, 2, 20, 0, []move{{from: 2, quantity: 15}}},
		{"ServingEmpty", []Hint{known(0), known(0), known(30)}, 2, 20, 0, []move{{from: 2, quantity: 20}}},
		{"RetiringHoldsMostNotTarget", []Hint{known(1), known(2), known(30)}, 2, 3, 1, []move{{from: 2, quantity: 1}}},
		{"NotEnough", []Hint{known(1), known(0), known(3)}, 2, 5, -1, nil},
		// Every shard in service is empty and the first is halted: gather
		// on the next one.
		{"ServingEmptyFirstHalted", []Hint{halted(0), known(0), known(30)}, 2, 20, 1, []move{{from: 2, quantity: 20}}},
		{"ServingAllHalted", []Hint{halted(0), halted(5), known(30)}, 2, 20, -1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, moves := consolidation(tc.hints, tc.serving, tc.q, nil)
			if target != tc.wantTarget || !slices.Equal(moves, tc.wantMoves) {
				t.Errorf("consolidation(%v, %d, %d) = %d, %v, want %d, %v", tc.hints, tc.serving, tc.q, target, moves, tc.wantTarget, tc.wantMoves)
			}
		})
	}
}
