package memory

import (
	"context"
	"encoding/base64"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/rpc"
	"github.com/shardstock/shardstock/internal/stock"
)

// Page sizes of ListLedger, as shardstock's.
const (
	pageSizeDefault = 100
	pageSizeMax     = 1000
)

// CreateSku creates a SKU with its initial stock, validated as shardstock
// validates it. Shards is checked and echoed; the SKU is one row.
func (s *Server) CreateSku(_ context.Context, req *connect.Request[v1.CreateSkuRequest]) (*connect.Response[v1.CreateSkuResponse], error) {
	m := req.Msg
	cfg := stock.SKU{
		SKU: m.GetSku(), Status: stock.StatusActive, Shards: m.GetShards(), MaxPerOrder: m.GetMaxPerOrder(),
		CustomerLimit: m.GetCustomerLimit(), ReservationTTL: rpc.DurationOf(m.GetReservationTtl()),
	}
	if cfg.Shards == 0 {
		cfg.Shards = 1
	}
	if cfg.ReservationTTL == 0 {
		cfg.ReservationTTL = stock.ReservationTTLDefault
	}
	if err := validateSKU(cfg, m.GetInitialStock()); err != nil {
		return nil, rpc.ToConnect(err)
	}
	k := &sku{cfg: cfg, opening: m.GetInitialStock(), counts: stock.Counts{Available: m.GetInitialStock()},
		reservations: map[string]*stock.Reservation{}, usage: map[string]int64{}}
	s.mu.Lock()
	_, exists := s.skus[cfg.SKU]
	if !exists {
		s.skus[cfg.SKU] = k
	}
	s.mu.Unlock()
	if exists {
		return nil, rpc.ToConnect(stock.Errorf(stock.CodeSKUExists, "sku %q already exists", cfg.SKU))
	}
	return connect.NewResponse(&v1.CreateSkuResponse{
		Sku: &v1.SkuConfig{Sku: cfg.SKU, Status: v1.SkuStatus_SKU_STATUS_ACTIVE, Shards: cfg.Shards, MaxPerOrder: cfg.MaxPerOrder,
			CustomerLimit: cfg.CustomerLimit, ReservationTtl: durationpb.New(cfg.ReservationTTL)},
		Stock: stockToProto(cfg.SKU, k.counts),
	}), nil
}

// validateSKU checks a new SKU's configuration with shardstock's bounds.
func validateSKU(cfg stock.SKU, initial int64) error {
	if err := stock.ValidateSKU(cfg.SKU); err != nil {
		return err
	}
	if err := stock.ValidateShards(cfg.Shards); err != nil {
		return err
	}
	if initial < 0 || initial > stock.StockMax {
		return stock.Errorf(stock.CodeInvalidQuantity, "initial_stock must be between 0 and %d", int64(stock.StockMax))
	}
	if cfg.MaxPerOrder < 0 || cfg.MaxPerOrder > stock.QuantityMax {
		return stock.Errorf(stock.CodeInvalidArgument, "max_per_order must be between 0 (no limit) and %d", stock.QuantityMax)
	}
	if cfg.CustomerLimit < 0 || cfg.CustomerLimit > stock.StockMax {
		return stock.Errorf(stock.CodeInvalidArgument, "customer_limit must be between 0 (no limit) and %d", int64(stock.StockMax))
	}
	return stock.ValidateTTL(cfg.ReservationTTL)
}

// Reconcile checks a SKU's books with shardstock's own check
// (ledger.Reconcile): opening stock plus the ledger's changes against the
// counts, each kind's entries against their quantities, the chain of
// before and after, held reservations against reserved, one ledger entry
// per operation and one end entry per ended reservation.
func (s *Server) Reconcile(_ context.Context, req *connect.Request[v1.ReconcileRequest]) (*connect.Response[v1.ReconcileResponse], error) {
	if err := stock.ValidateSKU(req.Msg.GetSku()); err != nil {
		return nil, rpc.ToConnect(err)
	}
	k, err := s.lookup(req.Msg.GetSku())
	if err != nil {
		return nil, rpc.ToConnect(err)
	}
	k.mu.Lock()
	snap, c := k.snapshot(), k.counts
	k.mu.Unlock()

	ds := ledger.Reconcile(snap)
	out := &v1.ReconcileResponse{Balanced: len(ds) == 0, Stock: stockToProto(k.cfg.SKU, c)}
	for _, d := range ds {
		out.Discrepancies = append(out.Discrepancies, &v1.Discrepancy{Check: d.Check, Shard: d.Shard, Detail: d.Detail, Expected: d.Expected, Actual: d.Actual})
	}
	return connect.NewResponse(out), nil
}

// snapshot is what ledger.Reconcile needs of k; k.mu is held.
func (k *sku) snapshot() ledger.Snapshot {
	sh := ledger.Shard{Row: k.counts, Opening: stock.Counts{Available: k.opening}, Kinds: map[stock.OpKind]ledger.KindSum{}}
	prev := sh.Opening
	keyed := map[string]int64{} // key -> keyed entries
	ends := map[string]int64{}  // reservation id -> end entries
	for _, e := range k.ledger {
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
	snap := ledger.Snapshot{SKU: k.cfg.SKU}
	for _, key := range k.opKeys {
		if n := keyed[key]; n != 1 {
			snap.KeyedMismatches = append(snap.KeyedMismatches, ledger.KeyMismatch{Key: key, Operations: 1, Entries: n})
		}
		delete(keyed, key)
	}
	for key, n := range keyed { // entries without an operation
		snap.KeyedMismatches = append(snap.KeyedMismatches, ledger.KeyMismatch{Key: key, Entries: n})
	}
	for id, r := range k.reservations {
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

// ListLedger pages through a SKU's ledger in id order. The page token is
// opaque (the last id given, encoded); the last page has none.
func (s *Server) ListLedger(_ context.Context, req *connect.Request[v1.ListLedgerRequest]) (*connect.Response[v1.ListLedgerResponse], error) {
	m := req.Msg
	if err := stock.ValidateSKU(m.GetSku()); err != nil {
		return nil, rpc.ToConnect(err)
	}
	after, err := decodeToken(m.GetPageToken())
	if err != nil {
		return nil, rpc.ToConnect(err)
	}
	k, err := s.lookup(m.GetSku())
	if err != nil {
		return nil, rpc.ToConnect(err)
	}
	size := int64(pageSizeDefault)
	if n := m.GetPageSize(); n > 0 {
		size = int64(min(n, pageSizeMax))
	}
	// Entries are never changed once appended and ids are positions plus
	// one: the page is a slice of the ledger, converted without the lock.
	k.mu.Lock()
	total := int64(len(k.ledger))
	from := min(after, total)
	to := min(from+size, total)
	page := k.ledger[from:to]
	k.mu.Unlock()

	out := &v1.ListLedgerResponse{Entries: make([]*v1.LedgerEntry, 0, len(page))}
	for _, e := range page {
		out.Entries = append(out.Entries, rpc.LedgerEntryToProto(e))
	}
	if to < total {
		out.NextPageToken = encodeToken(to)
	}
	return connect.NewResponse(out), nil
}

// Page tokens are opaque to clients: the last id given, in base64.
func encodeToken(after int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(after, 10)))
}

func decodeToken(tok string) (int64, error) {
	if tok == "" {
		return 0, nil
	}
	bad := stock.Errorf(stock.CodeInvalidArgument, "page_token is not one this API gave")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, bad
	}
	after, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || after < 0 {
		return 0, bad
	}
	return after, nil
}
