package rebalance

import (
	"slices"
	"testing"
)

func TestDecide(t *testing.T) {
	th := DefaultThresholds
	th.ByDemand = true
	for _, tc := range []struct {
		name   string
		shards []Shard
		force  bool
		policy Policy
		want   []Move
	}{
		{"BalancedStays", []Shard{{0, 50, 1, false}, {1, 50, 1, false}}, false, "", nil},
		{"WithinLowWaterStays", []Shard{{0, 70, 1, false}, {1, 30, 1, false}}, false, "", nil},
		{"BelowLowWaterRefills", []Shard{{0, 90, 1, false}, {1, 10, 1, false}}, false, PolicyRefill, []Move{{0, 1, 40}}},
		{"FewUnitsNoRefill", []Shard{{0, 50, 1, false}, {1, 2, 1, false}}, false, "", nil},
		{"ForceRefills", []Shard{{0, 70, 1, false}, {1, 30, 1, false}}, true, PolicyRefill, []Move{{0, 1, 20}}},
		// Demand on shard 1 only: it gets most, shard 0 keeps its floor.
		{"TowardDemand", []Shard{{0, 100, 0, false}, {1, 0, 100, false}}, false, PolicyRefill, []Move{{0, 1, 90}}},
		{"DrainRetiring", []Shard{{0, 10, 0, false}, {1, 10, 0, false}, {2, 20, 0, true}}, false, PolicyDrain, []Move{{2, 0, 10}, {2, 1, 10}}},
		{"TailGathers", []Shard{{0, 1, 0, false}, {1, 1, 5, false}, {2, 1, 0, false}}, false, PolicyTail, []Move{{0, 1, 1}, {2, 1, 1}}},
		{"TailOnOneShardStays", []Shard{{0, 0, 0, false}, {1, 2, 0, false}}, false, "", nil},
		{"SoldOut", []Shard{{0, 0, 3, false}, {1, 0, 0, false}}, true, "", nil},
		// A one-shard SKU split to 8 spreads to every new shard.
		{"Split", []Shard{{0, 8000, 0, false}, {1, 0, 0, false}, {2, 0, 0, false}, {3, 0, 0, false}, {4, 0, 0, false}, {5, 0, 0, false}, {6, 0, 0, false}, {7, 0, 0, false}},
			false, PolicyRefill, []Move{{0, 1, 1000}, {0, 2, 1000}, {0, 3, 1000}, {0, 4, 1000}, {0, 5, 1000}, {0, 6, 1000}, {0, 7, 1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy, got := Decide(tc.shards, th, tc.force)
			if policy != tc.policy || !slices.Equal(got, tc.want) {
				t.Errorf("Decide(%v, force %v) = %q %v, want %q %v", tc.shards, tc.force, policy, got, tc.policy, tc.want)
			}
			// Whatever it decides, no shard gives more than it holds and no
			// retiring shard receives.
			out := map[int32]int64{}
			for _, m := range got {
				out[m.From] += m.Quantity
				for _, s := range tc.shards {
					if s.Index == m.To && s.Retiring {
						t.Errorf("move %v fills a retiring shard", m)
					}
				}
			}
			for _, s := range tc.shards {
				if out[s.Index] > s.Available {
					t.Errorf("shard %d gives %d of its %d", s.Index, out[s.Index], s.Available)
				}
			}
		})
	}
}

// Without ByDemand (the default) the shares are even whatever the demand;
// the tail still gathers on the shard most asked for.
func TestDecide_Even(t *testing.T) {
	th := DefaultThresholds
	if policy, got := Decide([]Shard{{0, 100, 0, false}, {1, 0, 100, false}}, th, false); policy != PolicyRefill || !slices.Equal(got, []Move{{0, 1, 50}}) {
		t.Errorf("Decide without ByDemand = %q %v, want refill [{0 1 50}]", policy, got)
	}
	if policy, got := Decide([]Shard{{0, 1, 0, false}, {1, 1, 5, false}}, th, false); policy != PolicyTail || !slices.Equal(got, []Move{{0, 1, 1}}) {
		t.Errorf("tail without ByDemand = %q %v, want tail [{0 1 1}]", policy, got)
	}
}

func TestPlan_MoveMax(t *testing.T) {
	got := Plan([]Shard{{0, 100, 0, false}, {1, 0, 0, false}}, Options{MovesMax: 16, MoveMin: 1, MoveMax: 20})
	if want := []Move{{0, 1, 20}, {0, 1, 20}, {0, 1, 10}}; !slices.Equal(got, want) {
		t.Errorf("Plan with MoveMax 20 = %v, want %v", got, want)
	}
}
