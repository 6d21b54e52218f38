package memory

import (
	"context"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// CreateSKU creates a SKU with its initial stock, completed and validated
// as shardstock's are. The shard count is checked and kept; the SKU is one
// row.
func (s *Server) CreateSKU(_ context.Context, cfg stock.SKU, initial int64) (*stock.Stock, error) {
	if err := stock.PrepareNewSKU(&cfg, initial); err != nil {
		return nil, err
	}
	k := &sku{cfg: cfg, opening: initial, counts: stock.Counts{Available: initial},
		reservations: map[string]*stock.Reservation{}, usage: map[string]int64{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.skus[cfg.Name] != nil {
		return nil, stock.Errorf(stock.CodeSKUExists, "sku %q already exists", cfg.Name)
	}
	s.skus[cfg.Name] = k
	return k.stock(), nil // k is not shared yet
}

// UpdateSKU is not served.
func (s *Server) UpdateSKU(context.Context, string, stock.SKUUpdate) (*stock.SKU, error) {
	return nil, unimplemented("SKU updates")
}

// Reconcile checks a SKU's books with shardstock's own check
// (ledger.Check): opening stock plus the ledger's changes against the
// counts, each kind's entries against their quantities, the chain of
// before and after, held reservations against reserved, one ledger entry
// per operation and one end entry per ended reservation.
func (s *Server) Reconcile(_ context.Context, name string) ([]ledger.Discrepancy, error) {
	k, err := s.lookup(name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	snap := k.snapshot()
	k.mu.Unlock()
	return ledger.Check(snap), nil
}

// snapshot is what ledger.Check needs of k; k.mu is held.
func (k *sku) snapshot() ledger.Snapshot {
	return Snapshot(k.cfg.Name, k.counts, k.opening, k.ledger, k.opKeys, k.reservations)
}

// Snapshot is what ledger.Check needs of a SKU kept as one row (the
// in-memory ceiling's, and the Connect-fronted Redis's): its counts and
// opening stock, its ledger in order, the keys of its operations and its
// reservations by id.
func Snapshot(name string, counts stock.Counts, opening int64, entries []*stock.LedgerEntry, opKeys []string, reservations map[string]*stock.Reservation) ledger.Snapshot {
	sh := ledger.Shard{Row: counts, Opening: stock.Counts{Available: opening}, Kinds: map[stock.OpKind]ledger.KindSum{}}
	prev := sh.Opening
	keyed := map[string]int64{} // key -> keyed entries
	ends := map[string]int64{}  // reservation id -> end entries
	for _, e := range entries {
		ks := sh.Kinds[e.Kind]
		ks.Entries++
		ks.Quantity += e.Quantity
		ks.Delta = ks.Delta.Add(stock.Counts{
			Available: e.After.Available - e.Before.Available,
			Reserved:  e.After.Reserved - e.Before.Reserved,
			Sold:      e.After.Sold - e.Before.Sold,
		})
		sh.Kinds[e.Kind] = ks
		if e.Before != prev {
			sh.BrokenChain++
		}
		prev = e.After
		switch {
		case e.Kind.Keyed():
			keyed[e.IdempotencyKey]++
		case e.Kind == stock.OpCommit || e.Kind == stock.OpRelease || e.Kind == stock.OpExpire:
			ends[e.ReservationID]++
		}
	}
	snap := ledger.Snapshot{SKU: name}
	for _, key := range opKeys {
		if n := keyed[key]; n != 1 {
			snap.KeyedMismatches = append(snap.KeyedMismatches, ledger.KeyMismatch{Key: key, Operations: 1, Entries: n})
		}
		delete(keyed, key)
	}
	for key, n := range keyed { // entries without an operation
		snap.KeyedMismatches = append(snap.KeyedMismatches, ledger.KeyMismatch{Key: key, Entries: n})
	}
	for id, r := range reservations {
		want := int64(1)
		if r.State == stock.ReservationHeld {
			want = 0
			sh.HeldReserved += r.Quantity
		}
		if ends[id] != want {
			snap.EndMismatches = append(snap.EndMismatches, ledger.EndMismatch{ReservationID: id, State: r.State, Entries: ends[id]})
		}
	}
	snap.Shards = []ledger.Shard{sh}
	return snap
}

// ListLedger returns up to limit entries of a SKU with ids above after.
// Entries are never changed once appended and ids are positions plus one:
// the page is a slice of the ledger.
func (s *Server) ListLedger(_ context.Context, name string, after int64, limit int) ([]*stock.LedgerEntry, error) {
	k, err := s.lookup(name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	total := int64(len(k.ledger))
	from := min(after, total)
	return k.ledger[from:min(from+int64(limit), total)], nil
}

// ListTransfers: the memory target moves no stock between shards.
func (s *Server) ListTransfers(_ context.Context, f stock.TransferFilter, _ string, _ int) ([]*stock.Transfer, error) {
	_, err := s.lookup(f.SKU)
	return nil, err
}

// SetShards: a SKU here is one row, and the memory target has no
// rebalancer to spread or drain stock.
func (s *Server) SetShards(context.Context, string, int32) (*stock.Stock, error) {
	return nil, noRebalancer("SetShards")
}

// Rebalance: the memory target has no rebalancer.
func (s *Server) Rebalance(context.Context, string, bool) ([]*stock.Transfer, error) {
	return nil, noRebalancer("Rebalance")
}

// MoveLeases: no one ever moves stock here.
func (s *Server) MoveLeases(context.Context) ([]stock.MoveLease, error) { return nil, nil }

// noRebalancer is the error of the calls of the rebalancer.
func noRebalancer(call string) *stock.Error {
	return stock.Errorf(stock.CodeUnimplemented, "%s: the in-memory target has no rebalancer", call)
}

// Topology: the memory target has no shard servers.
func (s *Server) Topology() topology.View { return topology.View{} }

// ResumeShard answers as for a shard that is not halted: a SKU here halts
// as a whole, for good (a bug in the ceiling), and has no operator.
func (s *Server) ResumeShard(_ context.Context, k stock.ShardKey, _, _ string) (string, error) {
	if _, err := s.lookup(k.SKU); err != nil {
		return "", err
	}
	return "", stock.Errorf(stock.CodeShardNotHalted, "shard %d of sku %q is not halted", k.Index, k.SKU)
}
