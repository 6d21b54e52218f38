package loadgen

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
)

func TestParseQty(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want QtyDist
		ok   bool
	}{
		{"1", QtyDist{1, 1}, true},
		{"3", QtyDist{3, 3}, true},
		{"1..5", QtyDist{1, 5}, true},
		{"2..2", QtyDist{2, 2}, true},
		{"0", QtyDist{}, false},
		{"5..1", QtyDist{}, false},
		{"1..x", QtyDist{}, false},
		{"", QtyDist{}, false},
		{"1..2000000", QtyDist{}, false},
	} {
		got, err := ParseQty(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseQty(%q) = %v, %v, want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseMix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mix
		ok   bool
	}{
		{"deduct=100", Mix{Deduct: 100}, true},
		{"deduct=70,commit=20,release=10", Mix{70, 20, 10}, true},
		{"commit=1", Mix{Commit: 1}, true},
		{"deduct=0", Mix{}, false},
		{"deduct=-1", Mix{}, false},
		{"buy=1", Mix{}, false},
		{"deduct", Mix{}, false},
	} {
		got, err := ParseMix(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseMix(%q) = %v, %v, want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseModel(t *testing.T) {
	for in, want := range map[string]Model{"A": ModelA, "b": ModelB, "C": ModelC, "skew": ModelSkew, "case": ModelCase, "CASE": ModelCase, "drop": ModelDrop} {
		if got, err := ParseModel(in); err != nil || got != want {
			t.Errorf("ParseModel(%q) = %v, %v, want %v", in, got, err, want)
		}
	}
	if _, err := ParseModel("D"); err == nil {
		t.Errorf("ParseModel(D) = nil error, want one")
	}
}

// Model skew's keys all ask one of the first SkewShards shards first, by
// the allocator's hash (FNV-32a mod shards), and stay distinct.
func TestPlan_SkewKeys(t *testing.T) {
	p := newPlan(Config{Model: ModelSkew, SKUs: 3, Shards: 16, RunID: "t"})
	seen := map[string]bool{}
	for n := range 2000 {
		k := p.key(fmt.Sprintf("t-%d", n))
		h := fnv.New32a()
		h.Write([]byte(k))
		if first := h.Sum32() % 16; first >= SkewShards {
			t.Fatalf("key %q asks shard %d first, want below %d", k, first, SkewShards)
		}
		if seen[k] {
			t.Fatalf("key %q twice", k)
		}
		seen[k] = true
	}
	if k := newPlan(Config{Model: ModelA, SKUs: 3, Shards: 16, RunID: "t"}).key("t-1"); k != "t-1" {
		t.Errorf("model A key = %q, want it unchanged", k)
	}
}

// share draws n picks and returns the share that fell in [0, hot).
func share(p plan, hot int32, n int) float64 {
	r := rand.New(rand.NewPCG(1, 2))
	in := 0
	for range n {
		if p.pick(r) < hot {
			in++
		}
	}
	return float64(in) / float64(n)
}

func TestPlan(t *testing.T) {
	cfg := Config{SKUs: 1000, RunID: "x"}.withDefaults()
	t.Run("A", func(t *testing.T) {
		cfg := cfg
		cfg.Model = ModelA
		if s := share(newPlan(cfg), 200, 100_000); s < 0.18 || s > 0.22 {
			t.Errorf("model A: first 20%% of SKUs got %.3f of requests, want about 0.2", s)
		}
	})
	t.Run("B", func(t *testing.T) {
		cfg := cfg
		cfg.Model = ModelB
		if s := share(newPlan(cfg), 200, 100_000); s < 0.78 || s > 0.82 {
			t.Errorf("model B: hot 20%% of SKUs got %.3f of requests, want about 0.8", s)
		}
	})
	t.Run("C", func(t *testing.T) {
		cfg := cfg
		cfg.Model = ModelC
		p := newPlan(cfg)
		if s := share(p, 1, 100_000); s < 0.68 || s > 0.72 {
			t.Errorf("model C: hot SKU got %.3f of requests, want about 0.7", s)
		}
		if p.skus[0].Stock != HotStock || p.skus[1].Stock != cfg.Stock {
			t.Errorf("model C stock: hot %d, other %d, want %d, %d", p.skus[0].Stock, p.skus[1].Stock, HotStock, cfg.Stock)
		}
	})
	t.Run("Case", func(t *testing.T) {
		cfg := Config{Model: ModelCase, RunID: "x"}.withDefaults()
		p := newPlan(cfg)
		if len(p.skus) != 1 || p.skus[0].Stock != CaseStock || len(p.fixed) != CaseRequests {
			t.Fatalf("case plan: %d SKUs, stock %d, %d requests, want 1, %d, %d", len(p.skus), p.skus[0].Stock, len(p.fixed), CaseStock, CaseRequests)
		}
		keys := map[string]int{}
		for _, f := range p.fixed {
			keys[f.key]++
			if f.qty != 1 || f.kind != flowDeduct {
				t.Fatalf("case flow %+v, want a deduct of 1", f)
			}
		}
		if len(keys) != CaseRequests-CaseReusedKeys {
			t.Errorf("case plan: %d distinct keys, want %d", len(keys), CaseRequests-CaseReusedKeys)
		}
	})
}

func TestFalseRefusals(t *testing.T) {
	for _, tc := range []struct {
		name     string
		oos      []oosEvent
		releases []releaseEvent
		final    int64
		want     int64
	}{
		{"NoReleases", []oosEvent{{qty: 1, start: 5}, {qty: 3, start: 6}}, nil, 2, 1},
		{"ReleaseAfterRefusal", []oosEvent{{qty: 1, start: 5}}, []releaseEvent{{qty: 2, end: 9}}, 2, 0},
		{"ReleaseBeforeRefusal", []oosEvent{{qty: 1, start: 5}}, []releaseEvent{{qty: 2, end: 4}}, 2, 1},
		{"UnknownRelease", []oosEvent{{qty: 1, start: 5}}, []releaseEvent{{qty: 1, end: neverEnds}}, 2, 1},
		{"UnknownReleaseCovers", []oosEvent{{qty: 2, start: 5}}, []releaseEvent{{qty: 1, end: neverEnds}}, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &skuView{oos: tc.oos, releases: tc.releases}
			if got := falseRefusals(v, tc.final, 0); got != tc.want {
				t.Errorf("falseRefusals(final %d) = %d, want %d", tc.final, got, tc.want)
			}
		})
	}
}
