package rebalance

import (
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	opts := Options{MovesMax: 16, MoveMin: 1}
	for _, tc := range []struct {
		name   string
		shards []Shard
		opts   Options
		want   []Move
	}{
		{"Balanced", []Shard{{0, 5, 0, false}, {1, 5, 0, false}}, opts, nil},
		{"OneFull", []Shard{{0, 12, 0, false}, {1, 0, 0, false}, {2, 0, 0, false}}, opts, []Move{{0, 1, 4}, {0, 2, 4}}},
		{"ByDemand", []Shard{{0, 10, 1, false}, {1, 10, 3, false}}, opts, []Move{{0, 1, 5}}},
		{"RemainderToFirst", []Shard{{0, 0, 0, false}, {1, 7, 0, false}}, opts, []Move{{1, 0, 4}}},
		{"MoveMin", []Shard{{0, 6, 0, false}, {1, 4, 0, false}}, Options{MovesMax: 16, MoveMin: 2}, nil},
		{"MovesMax", []Shard{{0, 30, 0, false}, {1, 0, 0, false}, {2, 0, 0, false}}, Options{MovesMax: 1, MoveMin: 1}, []Move{{0, 1, 10}}},
		{"Empty", nil, opts, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Plan(tc.shards, tc.opts); !slices.Equal(got, tc.want) {
				t.Errorf("Plan(%v) = %v, want %v", tc.shards, got, tc.want)
			}
		})
	}
}

// TestPlan_Invariants: on many snapshots, a plan never asks a shard for
// more than it holds and never changes the total.
func TestPlan_Invariants(t *testing.T) {
	for seed := int64(0); seed < 500; seed++ {
		n := int(seed%9) + 1
		shards := make([]Shard, n)
		for i := range shards {
			shards[i] = Shard{Index: int32(i), Available: (seed*7919 + int64(i)*104729) % 97, Demand: (seed + int64(i)*3) % 5}
		}
		after := map[int32]int64{}
		var total int64
		for _, s := range shards {
			after[s.Index] = s.Available
			total += s.Available
		}
		for _, m := range Plan(shards, Options{MovesMax: 64, MoveMin: 1}) {
			if m.Quantity <= 0 || m.From == m.To {
				t.Fatalf("Plan(%v): bad move %v", shards, m)
			}
			after[m.From] -= m.Quantity
			after[m.To] += m.Quantity
			if after[m.From] < 0 {
				t.Fatalf("Plan(%v): shard %d driven to %d", shards, m.From, after[m.From])
			}
		}
		var sum int64
		for _, v := range after {
			sum += v
		}
		if sum != total {
			t.Fatalf("Plan(%v): total %d -> %d", shards, total, sum)
		}
	}
}
