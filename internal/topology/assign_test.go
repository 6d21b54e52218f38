package topology

import (
	"fmt"
	"maps"
	"testing"
)

func TestAssign(t *testing.T) {
	tests := []struct {
		name       string
		partitions int
		servers    []string
		wantLen    int
	}{
		{"NoServers", 16, nil, 0},
		{"NoPartitions", 0, []string{"a"}, 0},
		{"NegativePartitions", -1, []string{"a"}, 0},
		{"OneServer", 16, []string{"a"}, 16},
		{"Duplicates", 16, []string{"a", "b", "a"}, 16},
		{"Many", 256, []string{"shard-0", "shard-1", "shard-2", "shard-3", "shard-4"}, 256},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Assign(tt.partitions, tt.servers)
			if len(got) != tt.wantLen {
				t.Fatalf("len(Assign(%d, %v)) = %d, want %d", tt.partitions, tt.servers, len(got), tt.wantLen)
			}
			valid := make(map[string]bool)
			for _, s := range tt.servers {
				valid[s] = true
			}
			for p, s := range got {
				if p < 0 || int(p) >= tt.partitions || !valid[s] {
					t.Errorf("Assign(%d, %v)[%d] = %q, want a partition in range and one of the servers", tt.partitions, tt.servers, p, s)
				}
			}
			// The result depends on the set of servers, not their order.
			reversed := make([]string, len(tt.servers))
			for i, s := range tt.servers {
				reversed[len(reversed)-1-i] = s
			}
			if again := Assign(tt.partitions, reversed); !maps.Equal(got, again) {
				t.Errorf("Assign(%d, %v) != Assign(%d, %v)", tt.partitions, tt.servers, tt.partitions, reversed)
			}
		})
	}
}

func TestAssign_Balance(t *testing.T) {
	for _, servers := range [][]string{
		{"shard-0", "shard-1", "shard-2"},
		{"a", "b", "c"},
		{"shard-a", "shard-b", "shard-c"},
		{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"},
	} {
		counts := countByServer(Assign(256, servers))
		for _, s := range servers {
			if n := counts[s]; n < 60 || n > 110 {
				t.Errorf("Assign(256, %v) gives %s %d partitions, want 60..110 (all: %v)", servers, s, n, counts)
			}
		}
	}
}

func TestAssign_Stability(t *testing.T) {
	three := []string{"shard-0", "shard-1", "shard-2"}
	four := append(three[:3:3], "shard-3")
	before, after := Assign(256, three), Assign(256, four)
	moved := 0
	for p, s := range after {
		if s != before[p] {
			moved++
			if s != "shard-3" {
				t.Errorf("adding shard-3 moved partition %d from %s to %s, want only moves to shard-3", p, before[p], s)
			}
		}
	}
	if moved < 40 || moved > 90 {
		t.Errorf("adding a 4th server moved %d partitions, want about 64", moved)
	}
	// Removing a server moves only its own partitions.
	two := []string{"shard-0", "shard-2"}
	for p, s := range Assign(256, two) {
		if before[p] != "shard-1" && s != before[p] {
			t.Errorf("removing shard-1 moved partition %d from %s to %s", p, before[p], s)
		}
	}
}

func countByServer(a map[int32]string) map[string]int {
	counts := make(map[string]int)
	for _, s := range a {
		counts[s]++
	}
	return counts
}

func TestPartitionKey(t *testing.T) {
	for _, p := range []int32{0, 7, 42, 255, 999} {
		key := partitionKey(p)
		if want := fmt.Sprintf("/shardstock/partitions/%03d", p); key != want {
			t.Errorf("partitionKey(%d) = %q, want %q", p, key, want)
		}
		if got, ok := parsePartitionKey(key, 1000); !ok || got != p {
			t.Errorf("parsePartitionKey(%q) = %d, %v, want %d, true", key, got, ok, p)
		}
	}
	for _, key := range []string{"/shardstock/partitions/16", "/shardstock/partitions/x", "/shardstock/partitions/0016", "/shardstock/servers/016"} {
		if p, ok := parsePartitionKey(key, 16); ok {
			t.Errorf("parsePartitionKey(%q, 16) = %d, true, want false", key, p)
		}
	}
}
