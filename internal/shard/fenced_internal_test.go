package shard

import (
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestServer_FencedKeepsNewEpochWriter: a writer of an old epoch that
// learns it was fenced after this server took its partition back at a new
// epoch (a lease lost and registered again) leaves the new epoch's writer
// in place. Dropping it made the next request start a second writer of the
// shard beside it, and each then saw the other's writes as a divergence
// and halted the shard (TestE2E_NetnsFaults: "diverged again right after
// it was reloaded").
func TestServer_FencedKeepsNewEpochWriter(t *testing.T) {
	key := stock.ShardKey{SKU: "again", Index: 4}
	p := key.Partition()
	s := &Server{owned: map[int32]int64{p: 867}, writers: map[stock.ShardKey]*writer{}}
	old := &writer{srv: s, key: key, fence: stock.Fence{Partition: p, Epoch: 57}}
	current := &writer{srv: s, key: key, fence: stock.Fence{Partition: p, Epoch: 867}}
	s.writers[key] = current
	s.fenced(old)
	if got := s.writers[key]; got != current {
		t.Fatalf("after the epoch-57 writer was fenced, writers[%s] = %p, want the epoch-867 writer %p", key, got, current)
	}
	if s.owned[p] != 867 {
		t.Errorf("owned[%d] = %d, want 867 kept", p, s.owned[p])
	}
}
