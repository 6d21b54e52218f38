// Package memory is the load generator's ceiling: a correct, minimal
// implementation of shardstock's public Connect API (InventoryService and
// AdminService) that keeps everything in one process's memory. There is no
// durability, no database and no distribution; what is left is the cost of
// Connect over cleartext HTTP/2 and of exact bookkeeping, so its throughput
// is what any implementation of this API can reach on the machine.
//
// Server implements api.Inventory and api.Admin, so the requests go through
// shardstock's own handlers (internal/api: conversions, error reasons, page
// tokens); only what is behind them differs. The calls it serves have
// shardstock's semantics: Deduct, Reserve, Commit, Release, GetOperation,
// GetStock, CreateSku, Reconcile and ListLedger, with the same validation
// (internal/stock), the same decisions (shardstock's own planner,
// stock.EvaluateBatch: replays, refusals, stock, reservation ends), idempotency keys
// global across SKUs, a ledger entry per change and the same
// reconciliation (internal/ledger). Where it differs:
//   - a SKU is one row: shards is accepted and echoed, every entry is on
//     shard 0;
//   - no sweeper: a held reservation expires only when a commit or a
//     release finds it due;
//   - admin calls need no token (the Authorization header is accepted and
//     ignored);
//   - ledger entry ids count from 1 per SKU;
//   - Replenish, AdjustStock, UpdateSku, SetShards and Rebalance answer
//     unimplemented (there is no rebalancer), and there are no transfers,
//     no move leases and no topology.
package memory

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

// Limits of the server.
const (
	// entriesMax bounds the ledger entries the server holds over all SKUs
	// (a few hundred bytes each): past it every change is refused.
	entriesMax = 20_000_000
)

// serverID names the process in ledger entries and GetStock's shard.
const serverID = "memory"

// Server serves the public API from memory. Its zero value is not usable:
// call New.
type Server struct {
	mu   sync.RWMutex
	skus map[string]*sku

	// keysMu guards keys. Lock order: a SKU's mu, then keysMu (never the
	// other way round): a keyed request holds both from the key's lookup
	// to its insertion, so the same key sent to two SKUs at once is
	// applied once and refused once.
	keysMu sync.Mutex
	keys   map[string]*stock.Operation // by idempotency key, over all SKUs

	entries atomic.Int64 // ledger entries over all SKUs
}

var _ api.Admin = (*Server)(nil)

// sku is one SKU's books, guarded by mu.
type sku struct {
	mu           sync.Mutex
	cfg          stock.SKU
	opening      int64 // initial stock
	counts       stock.Counts
	reservations map[string]*stock.Reservation
	opKeys       []string         // keys of the SKU's operations, for Reconcile
	usage        map[string]int64 // units held or bought per customer, with a customer limit
	ledger       []*stock.LedgerEntry
	// halted is set when a change would break an invariant (a bug): the
	// SKU refuses every later change.
	halted bool
}

// New returns an empty server.
func New() *Server {
	return &Server{skus: map[string]*sku{}, keys: map[string]*stock.Operation{}}
}

// Handler returns the InventoryService and AdminService, with gRPC health,
// reflection and /healthz, built with shardstock's handler options.
func (s *Server) Handler() http.Handler {
	mux := transport.NewMux(transport.MuxConfig{Services: []string{shardstockv1connect.InventoryServiceName, shardstockv1connect.AdminServiceName}})
	mux.Handle(shardstockv1connect.NewInventoryServiceHandler(&api.InventoryHandler{Inventory: s}, transport.PublicHandlerOptions()...))
	mux.Handle(shardstockv1connect.NewAdminServiceHandler(&api.AdminHandler{Admin: s}, transport.PublicHandlerOptions()...))
	return mux
}

// Serve serves a new Server on l over HTTP/1.1 and cleartext HTTP/2 until
// ctx ends, then shuts down gracefully.
func Serve(ctx context.Context, l net.Listener) error {
	return transport.Serve(ctx, l, New().Handler())
}

// lookup returns the SKU, or INVALID_ARGUMENT for a malformed name and
// SKU_NOT_FOUND for an unknown one.
func (s *Server) lookup(name string) (*sku, error) {
	if err := stock.ValidateSKU(name); err != nil {
		return nil, err
	}
	s.mu.RLock()
	k := s.skus[name]
	s.mu.RUnlock()
	if k == nil {
		return nil, stock.Errorf(stock.CodeSKUNotFound, "no sku %q", name)
	}
	return k, nil
}

// record appends the planner's ledger entries to k's ledger and moves k's
// counts to the last entry's; k.mu is held. It changes nothing and answers
// INTERNAL when the entries do not chain from k's counts (a bug: the SKU
// halts) or the ledger would pass entriesMax.
func (s *Server) record(k *sku, es []*stock.LedgerEntry) *stock.Error {
	at := k.counts
	for _, e := range es {
		if e.Before != at || !e.After.Valid() {
			k.halted = true
			return stock.Errorf(stock.CodeInternal, "INVARIANT: %s of %d would take sku %q from %+v to %+v", e.Kind, e.Quantity, k.cfg.Name, e.Before, e.After)
		}
		at = e.After
	}
	if s.entries.Add(int64(len(es))) > entriesMax {
		s.entries.Add(-int64(len(es)))
		return stock.Errorf(stock.CodeInternal, "the memory target holds %d ledger entries, its bound", entriesMax)
	}
	now := time.Now()
	for _, e := range es {
		e.ID = int64(len(k.ledger)) + 1
		e.ServerID = serverID
		e.CreatedAt = now
		k.ledger = append(k.ledger, e)
	}
	k.counts = at
	return nil
}
