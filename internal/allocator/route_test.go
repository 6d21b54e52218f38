package allocator

import (
	"fmt"
	"slices"
	"testing"
)

// known, halted and unknown build hints for the tables.
func known(available int64) hint { return hint{available: available, known: true} }

var unknown = hint{}

func skipOnly(idx ...int32) func(int32) bool {
	return func(i int32) bool { return slices.Contains(idx, i) }
}

func TestRoute_Candidates(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int32
		first int32
		hints []hint
		q     int64
		skip  func(int32) bool
		want  []int32
	}{
		{"OneShard", 1, 0, []hint{unknown}, 1, nil, []int32{0}},
		{"AllUnknownByDistance", 4, 2, []hint{unknown, unknown, unknown, unknown}, 1, nil, []int32{2, 3, 0, 1}},
		{"MostAvailableFirst", 4, 0, []hint{unknown, known(20), known(50), known(30)}, 10, nil, []int32{0, 2, 3, 1}},
		{"UnknownBeforeKnown", 4, 0, []hint{unknown, known(100), unknown, known(50)}, 10, nil, []int32{0, 2, 1, 3}},
		{"TiesByDistance", 4, 3, []hint{known(10), known(10), known(10), unknown}, 5, nil, []int32{3, 0, 1, 2}},
		{"FirstChoiceKnownShort", 4, 1, []hint{unknown, known(5), unknown, unknown}, 10, nil, []int32{2, 3, 0}},
		{"FirstChoiceKnownShortStillLeadsWhenEnough", 3, 1, []hint{known(99), known(10), known(50)}, 10, nil, []int32{1, 0, 2}},
		{"ExactlyEnoughFits", 2, 0, []hint{known(7), known(6)}, 7, nil, []int32{0}},
		{"EmptyShardLeftOut", 3, 0, []hint{known(0), known(0), unknown}, 1, nil, []int32{2}},
		{"SkippedLeftOut", 4, 0, []hint{unknown, unknown, known(9), unknown}, 1, skipOnly(0, 2), []int32{1, 3}},
		{"AllSkipped", 2, 1, []hint{unknown, known(9)}, 1, skipOnly(0, 1), []int32{}},
		{"NoneEnough", 3, 0, []hint{known(1), known(2), known(3)}, 4, nil, []int32{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Collect(candidates(tc.n, tc.first, tc.hints, tc.q, tc.skip))
			if !slices.Equal(got, tc.want) {
				t.Errorf("candidates(%d, %d, %v, %d) = %v, want %v", tc.n, tc.first, tc.hints, tc.q, got, tc.want)
			}
		})
	}
}

// TestRoute_CandidatesLazy: a request that ends at its first choice looks
// no other shard's server up.
func TestRoute_CandidatesLazy(t *testing.T) {
	var looked []int32
	skip := func(i int32) bool { looked = append(looked, i); return false }
	for i := range candidates(16, 5, make([]hint, 16), 1, skip) {
		if i != 5 {
			t.Fatalf("first candidate %d, want the first choice 5", i)
		}
		break
	}
	if !slices.Equal(looked, []int32{5}) {
		t.Errorf("skip asked about %v, want only the first choice [5]", looked)
	}
}

func TestRoute_FirstChoice(t *testing.T) {
	// FNV-32a: "" hashes to 0x811c9dc5, "a" to 0xe40c292c.
	for _, tc := range []struct {
		key  string
		n    int32
		want int32
	}{
		{"", 1, 0},
		{"", 8, 0x811c9dc5 % 8},
		{"", 7, 0x811c9dc5 % 7},
		{"a", 8, 0xe40c292c % 8},
		{"a", 256, 0xe40c292c % 256},
	} {
		t.Run(fmt.Sprintf("%q/%d", tc.key, tc.n), func(t *testing.T) {
			if got := firstChoice(tc.key, tc.n); got != tc.want {
				t.Errorf("firstChoice(%q, %d) = %d, want %d", tc.key, tc.n, got, tc.want)
			}
		})
	}
	t.Run("Spread", func(t *testing.T) {
		// Keys spread over the shards: none gets fewer than half its share.
		const n, keys = 8, 8000
		var per [n]int
		for i := range keys {
			per[firstChoice(fmt.Sprintf("order-%d", i), n)]++
		}
		for i, c := range per {
			if c < keys/n/2 {
				t.Errorf("firstChoice put %d of %d keys on shard %d, want at least %d", c, keys, i, keys/n/2)
			}
		}
	})
}
