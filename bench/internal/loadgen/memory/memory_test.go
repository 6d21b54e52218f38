package memory

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// start serves a new Server with Serve on 127.0.0.1 and returns its base
// URL; the server stops, and must stop cleanly, in t.Cleanup.
func start(t *testing.T) string {
	t.Helper()
	return listen(t, func(ctx context.Context, l net.Listener) error { return Serve(ctx, l) })
}

// startServer serves srv, for tests that look inside it.
func startServer(t *testing.T, srv *Server) string {
	t.Helper()
	return listen(t, func(ctx context.Context, l net.Listener) error { return transport.Serve(ctx, l, srv.Handler()) })
}

func listen(t *testing.T, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve() = %v, want nil after the context ends", err)
		}
	})
	return "http://" + l.Addr().String()
}

// client returns the load generator's shardstock client for base.
func client(t *testing.T, base string) *shardstock.Target {
	t.Helper()
	c := shardstock.New(shardstock.Config{Addr: base, AdminToken: "any-token-is-accepted"})
	t.Cleanup(func() { c.Close() })
	return c
}

var skuSeq struct {
	sync.Mutex
	n int
}

// newSKU creates a SKU with units of stock and returns its spec.
func newSKU(t *testing.T, c *shardstock.Target, units int64) loadgen.SKUSpec {
	t.Helper()
	skuSeq.Lock()
	skuSeq.n++
	name := fmt.Sprintf("sku-%d", skuSeq.n)
	skuSeq.Unlock()
	spec := loadgen.SKUSpec{SKU: name, Stock: units, Shards: 4}
	if err := c.Setup(context.Background(), []loadgen.SKUSpec{spec}); err != nil {
		t.Fatalf("Setup(%s) = %v", name, err)
	}
	return spec
}

// same reports whether two outcomes agree on status and code.
func same(got, want loadgen.Outcome) bool { return got.Status == want.Status && got.Code == want.Code }

func errOf(c stock.Code) loadgen.Outcome { return loadgen.Error(string(c)) }

// verify reads spec's state through the client and checks that its books
// are clean: no discrepancy, one operation per key, no extra end.
func verify(t *testing.T, c *shardstock.Target, spec loadgen.SKUSpec) loadgen.SKUState {
	t.Helper()
	st, err := c.Verify(context.Background(), []loadgen.SKUSpec{spec})
	if err != nil {
		t.Fatalf("Verify() = %v", err)
	}
	s := st.SKUs[spec.SKU]
	if len(s.Discrepancies) != 0 || s.Operations != s.DistinctKeys || s.ExtraEnds != 0 {
		t.Errorf("Verify() = %+v, want no discrepancy, one operation per key, no extra end", s)
	}
	return s
}

func wantCounts(t *testing.T, s loadgen.SKUState, available, reserved, sold int64) {
	t.Helper()
	if s.Available != available || s.Reserved != reserved || s.Sold != sold || s.InTransit != 0 {
		t.Errorf("counts = available %d, reserved %d, sold %d, in transit %d; want %d, %d, %d, 0",
			s.Available, s.Reserved, s.Sold, s.InTransit, available, reserved, sold)
	}
}

func TestServer_Deduct(t *testing.T) {
	ctx := context.Background()
	c := client(t, start(t))

	t.Run("OK", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		if o := c.Deduct(ctx, spec.SKU, "ok-1", 2); !same(o, loadgen.OK) {
			t.Errorf("Deduct(2) = %v, want ok", o)
		}
		s := verify(t, c, spec)
		wantCounts(t, s, 3, 0, 2)
		if s.Ledger["deduct"] != 1 || s.DistinctKeys != 1 {
			t.Errorf("ledger %v, %d keys; want one deduct entry of one key", s.Ledger, s.DistinctKeys)
		}
	})
	t.Run("Replay", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		for i, want := range []loadgen.Outcome{loadgen.OK, loadgen.Replayed, loadgen.Replayed} {
			if o := c.Deduct(ctx, spec.SKU, "replay-1", 2); !same(o, want) {
				t.Errorf("Deduct #%d = %v, want %v", i+1, o, want)
			}
		}
		wantCounts(t, verify(t, c, spec), 3, 0, 2)
	})
	t.Run("Reused", func(t *testing.T) {
		spec, other := newSKU(t, c, 5), newSKU(t, c, 5)
		if o := c.Deduct(ctx, spec.SKU, "reused-1", 1); !same(o, loadgen.OK) {
			t.Fatalf("Deduct(1) = %v, want ok", o)
		}
		reused := errOf(stock.CodeIdempotencyKeyReused)
		if o := c.Deduct(ctx, spec.SKU, "reused-1", 2); !same(o, reused) {
			t.Errorf("Deduct(other quantity) = %v, want %v", o, reused)
		}
		if o := c.Deduct(ctx, other.SKU, "reused-1", 1); !same(o, reused) {
			t.Errorf("Deduct(other sku) = %v, want %v", o, reused)
		}
		if _, o := c.Reserve(ctx, spec.SKU, "reused-1", 1); !same(o, reused) {
			t.Errorf("Reserve(same key) = %v, want %v", o, reused)
		}
		wantCounts(t, verify(t, c, spec), 4, 0, 1)
		wantCounts(t, verify(t, c, other), 5, 0, 0)
	})
	t.Run("OutOfStock", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		if o := c.Deduct(ctx, spec.SKU, "oos-1", 6); !same(o, loadgen.OutOfStock) {
			t.Errorf("Deduct(6 of 5) = %v, want out-of-stock", o)
		}
		// Nothing was recorded: the key is free for other parameters.
		if o := c.Deduct(ctx, spec.SKU, "oos-1", 5); !same(o, loadgen.OK) {
			t.Errorf("Deduct(5 of 5, same key) = %v, want ok", o)
		}
		if o := c.Deduct(ctx, spec.SKU, "oos-2", 1); !same(o, loadgen.OutOfStock) {
			t.Errorf("Deduct(1 of 0) = %v, want out-of-stock", o)
		}
		s := verify(t, c, spec)
		wantCounts(t, s, 0, 0, 5)
		if s.Ledger["deduct"] != 1 {
			t.Errorf("ledger %v, want one deduct entry", s.Ledger)
		}
	})
	t.Run("SKUNotFound", func(t *testing.T) {
		if o := c.Deduct(ctx, "no-such-sku", "nf-1", 1); !same(o, errOf(stock.CodeSKUNotFound)) {
			t.Errorf("Deduct(no-such-sku) = %v, want SKU_NOT_FOUND", o)
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		for _, tc := range []struct {
			name, sku, key string
			qty            int64
			want           stock.Code
		}{
			{"EmptySKU", "", "k", 1, stock.CodeInvalidSKU},
			{"SKUWithSpace", "a b", "k", 1, stock.CodeInvalidSKU},
			{"LongSKU", strings.Repeat("s", stock.SKULenMax+1), "k", 1, stock.CodeInvalidSKU},
			{"ZeroQuantity", spec.SKU, "k", 0, stock.CodeInvalidQuantity},
			{"NegativeQuantity", spec.SKU, "k", -1, stock.CodeInvalidQuantity},
			{"HugeQuantity", spec.SKU, "k", stock.QuantityMax + 1, stock.CodeInvalidQuantity},
			{"EmptyKey", spec.SKU, "", 1, stock.CodeInvalidIdempotencyKey},
			{"KeyWithSpace", spec.SKU, "a b", 1, stock.CodeInvalidIdempotencyKey},
			{"LongKey", spec.SKU, strings.Repeat("k", stock.IdempotencyKeyLenMax+1), 1, stock.CodeInvalidIdempotencyKey},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if o := c.Deduct(ctx, tc.sku, tc.key, tc.qty); !same(o, errOf(tc.want)) {
					t.Errorf("Deduct(%q, %q, %d) = %v, want %s", tc.sku, tc.key, tc.qty, o, tc.want)
				}
				if _, o := c.Reserve(ctx, tc.sku, tc.key, tc.qty); !same(o, errOf(tc.want)) {
					t.Errorf("Reserve(%q, %q, %d) = %v, want %s", tc.sku, tc.key, tc.qty, o, tc.want)
				}
			})
		}
		wantCounts(t, verify(t, c, spec), 5, 0, 0)
	})
}

func TestServer_Reservation(t *testing.T) {
	ctx := context.Background()
	c := client(t, start(t))

	reserve := func(t *testing.T, sku, key string, qty int64) string {
		t.Helper()
		id, o := c.Reserve(ctx, sku, key, qty)
		if !same(o, loadgen.OK) || id == "" {
			t.Fatalf("Reserve(%d) = %q, %v; want an id, ok", qty, id, o)
		}
		return id
	}
	t.Run("Replay", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		id := reserve(t, spec.SKU, "r-replay", 2)
		again, o := c.Reserve(ctx, spec.SKU, "r-replay", 2)
		if !same(o, loadgen.Replayed) || again != id {
			t.Errorf("Reserve(same key) = %q, %v; want %q, replayed", again, o, id)
		}
		wantCounts(t, verify(t, c, spec), 3, 2, 0)
	})
	t.Run("OutOfStock", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		reserve(t, spec.SKU, "r-oos-1", 4)
		if _, o := c.Reserve(ctx, spec.SKU, "r-oos-2", 2); !same(o, loadgen.OutOfStock) {
			t.Errorf("Reserve(2 of 1) = %v, want out-of-stock", o)
		}
		wantCounts(t, verify(t, c, spec), 1, 4, 0)
	})
	// A reservation ends once: the same end again replays, the other end
	// is refused, and the stock moves once.
	for _, tc := range []struct {
		name                 string
		end, other           func(context.Context, string) loadgen.Outcome
		refused              stock.Code
		available, sold      int64
		endEntry, otherEntry string
	}{
		{"CommitTwice", c.Commit, c.Release, stock.CodeReservationAlreadyCommitted, 3, 2, "commit", "release"},
		{"ReleaseTwice", c.Release, c.Commit, stock.CodeReservationAlreadyReleased, 5, 0, "release", "commit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := newSKU(t, c, 5)
			key := "r-" + tc.name
			id := reserve(t, spec.SKU, key, 2)
			if o := tc.end(ctx, id); !same(o, loadgen.OK) {
				t.Errorf("first %s = %v, want ok", tc.endEntry, o)
			}
			if o := tc.end(ctx, id); !same(o, loadgen.Replayed) {
				t.Errorf("second %s = %v, want replayed", tc.endEntry, o)
			}
			if o := tc.other(ctx, id); !same(o, errOf(tc.refused)) {
				t.Errorf("%s after %s = %v, want %s", tc.otherEntry, tc.endEntry, o, tc.refused)
			}
			if _, o := c.Reserve(ctx, spec.SKU, key, 2); !same(o, loadgen.Replayed) {
				t.Errorf("Reserve(same key) after %s = %v, want replayed", tc.endEntry, o)
			}
			s := verify(t, c, spec)
			wantCounts(t, s, tc.available, 0, tc.sold)
			if s.Ledger["reserve"] != 1 || s.Ledger[tc.endEntry] != 1 || s.Ledger[tc.otherEntry] != 0 {
				t.Errorf("ledger %v, want one reserve and one %s entry", s.Ledger, tc.endEntry)
			}
		})
	}
	t.Run("NotFound", func(t *testing.T) {
		spec := newSKU(t, c, 5)
		notFound := errOf(stock.CodeReservationNotFound)
		for _, tc := range []struct {
			name, id string
			want     loadgen.Outcome
		}{
			{"Unknown", stock.NewReservationID(stock.ShardKey{SKU: spec.SKU}), notFound},
			// Well formed, of a shard the one-row target never makes: parsed, then not found.
			{"OtherShard", stock.NewReservationID(stock.ShardKey{SKU: spec.SKU, Index: 1}), notFound},
			{"UnknownSKU", stock.NewReservationID(stock.ShardKey{SKU: "no-such-sku"}), notFound},
			{"Malformed", "not-a-reservation", notFound},
			{"Empty", "", errOf(stock.CodeInvalidArgument)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if o := c.Commit(ctx, tc.id); !same(o, tc.want) {
					t.Errorf("Commit(%q) = %v, want %v", tc.id, o, tc.want)
				}
				if o := c.Release(ctx, tc.id); !same(o, tc.want) {
					t.Errorf("Release(%q) = %v, want %v", tc.id, o, tc.want)
				}
			})
		}
	})
}

// TestServer_Errors checks the Connect side of an error: the code of
// shardstock's table and the ErrorInfo reason, as any client reads them.
func TestServer_Errors(t *testing.T) {
	ctx := context.Background()
	base := start(t)
	c := client(t, base)
	spec := newSKU(t, c, 1)
	inv := shardstockv1connect.NewInventoryServiceClient(http.DefaultClient, base)
	admin := shardstockv1connect.NewAdminServiceClient(http.DefaultClient, base)
	if o := c.Deduct(ctx, spec.SKU, "e-1", 1); !same(o, loadgen.OK) {
		t.Fatalf("Deduct(1) = %v, want ok", o)
	}
	for _, tc := range []struct {
		name   string
		call   func() error
		code   connect.Code
		reason stock.Code
	}{
		{"OutOfStock", func() error {
			_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: spec.SKU, Quantity: 1, IdempotencyKey: "e-2"}))
			return err
		}, connect.CodeFailedPrecondition, stock.CodeOutOfStock},
		{"Reused", func() error {
			_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: spec.SKU, Quantity: 1, IdempotencyKey: "e-1", OrderRef: "other"}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeIdempotencyKeyReused},
		{"BadTTL", func() error {
			_, err := inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: spec.SKU, Quantity: 1, IdempotencyKey: "e-3",
				Ttl: durationpb.New(48 * time.Hour)}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeInvalidArgument},
		{"GetStockNotFound", func() error {
			_, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "no-such-sku"}))
			return err
		}, connect.CodeNotFound, stock.CodeSKUNotFound},
		{"GetStockBadName", func() error {
			_, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "bad name"}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeInvalidSKU},
		{"CreateSkuExists", func() error {
			_, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: spec.SKU, InitialStock: 1}))
			return err
		}, connect.CodeAlreadyExists, stock.CodeSKUExists},
		{"CreateSkuShards", func() error {
			_, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "many-shards", Shards: stock.ShardsMax + 1}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeInvalidArgument},
		{"CreateSkuStock", func() error {
			_, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "negative", InitialStock: -1}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeInvalidQuantity},
		{"ListLedgerToken", func() error {
			_, err := admin.ListLedger(ctx, connect.NewRequest(&v1.ListLedgerRequest{Sku: spec.SKU, PageToken: "!!"}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeInvalidArgument},
		{"ReconcileNotFound", func() error {
			_, err := admin.Reconcile(ctx, connect.NewRequest(&v1.ReconcileRequest{Sku: "no-such-sku"}))
			return err
		}, connect.CodeNotFound, stock.CodeSKUNotFound},
		{"ReconcileBadName", func() error {
			_, err := admin.Reconcile(ctx, connect.NewRequest(&v1.ReconcileRequest{Sku: ""}))
			return err
		}, connect.CodeInvalidArgument, stock.CodeInvalidSKU},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if connect.CodeOf(err) != tc.code || wire.Reason(err) != string(tc.reason) {
				t.Errorf("error = %v (reason %q), want %s with reason %s", err, wire.Reason(err), tc.code, tc.reason)
			}
		})
	}
	t.Run("Unimplemented", func(t *testing.T) {
		_, err := inv.Replenish(ctx, connect.NewRequest(&v1.ReplenishRequest{Sku: spec.SKU, Quantity: 1, IdempotencyKey: "e-4"}))
		if connect.CodeOf(err) != connect.CodeUnimplemented {
			t.Errorf("Replenish() = %v, want unimplemented", err)
		}
		_, err = admin.SetShards(ctx, connect.NewRequest(&v1.SetShardsRequest{Sku: spec.SKU, Shards: 4}))
		if connect.CodeOf(err) != connect.CodeUnimplemented || wire.Reason(err) != string(stock.CodeUnimplemented) {
			t.Errorf("SetShards() = %v (reason %q), want unimplemented, UNIMPLEMENTED", err, wire.Reason(err))
		}
		_, err = admin.Rebalance(ctx, connect.NewRequest(&v1.RebalanceRequest{Sku: spec.SKU, DryRun: true}))
		if connect.CodeOf(err) != connect.CodeUnimplemented || wire.Reason(err) != string(stock.CodeUnimplemented) {
			t.Errorf("Rebalance(dry run) = %v (reason %q), want unimplemented, UNIMPLEMENTED", err, wire.Reason(err))
		}
	})
	t.Run("NoMoveLeases", func(t *testing.T) {
		resp, err := admin.GetTopology(ctx, connect.NewRequest(&v1.GetTopologyRequest{}))
		if err != nil || len(resp.Msg.GetMoveLeases()) != 0 {
			t.Errorf("GetTopology() = %v, %v, want no move leases", resp, err)
		}
	})
}

func TestServer_CreateSku(t *testing.T) {
	ctx := context.Background()
	base := start(t)
	admin := shardstockv1connect.NewAdminServiceClient(http.DefaultClient, base)
	resp, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "created", InitialStock: 7, Shards: 8, MaxPerOrder: 3}))
	if err != nil {
		t.Fatalf("CreateSku() = %v", err)
	}
	cfg, st := resp.Msg.GetSku(), resp.Msg.GetStock()
	if cfg.GetShards() != 8 || cfg.GetMaxPerOrder() != 3 || cfg.GetReservationTtl().AsDuration() != stock.ReservationTTLDefault {
		t.Errorf("CreateSku() config = %v, want 8 shards, max_per_order 3, the default ttl", cfg)
	}
	if st.GetAvailable() != 7 || st.GetReserved() != 0 || st.GetSold() != 0 {
		t.Errorf("CreateSku() stock = %v, want 7 available", st)
	}
	inv := shardstockv1connect.NewInventoryServiceClient(http.DefaultClient, base)
	_, err = inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "created", Quantity: 4, IdempotencyKey: "c-1"}))
	if wire.Reason(err) != string(stock.CodeQuantityAboveMaxPerOrder) {
		t.Errorf("Deduct(4) = %v, want QUANTITY_ABOVE_MAX_PER_ORDER", err)
	}
	if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "created", Quantity: 3, IdempotencyKey: "c-1"})); err != nil {
		t.Errorf("Deduct(3, same key) = %v, want ok: a refusal records nothing", err)
	}
	got, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "created"}))
	if err != nil {
		t.Fatalf("GetStock() = %v", err)
	}
	if s := got.Msg.GetStock(); s.GetAvailable() != 4 || s.GetSold() != 3 || len(s.GetShards()) != 1 {
		t.Errorf("GetStock() = %v, want available 4, sold 3, one row", s)
	}
}

func TestServer_ListLedger(t *testing.T) {
	ctx := context.Background()
	base := start(t)
	c := client(t, base)
	spec := newSKU(t, c, 100)
	const deducts = 25
	for i := range deducts {
		if o := c.Deduct(ctx, spec.SKU, fmt.Sprintf("l-%d", i), 1); !same(o, loadgen.OK) {
			t.Fatalf("Deduct #%d = %v", i, o)
		}
	}
	admin := shardstockv1connect.NewAdminServiceClient(http.DefaultClient, base)
	var ids []int64
	var sizes []int
	token := ""
	for page := 0; page < 10; page++ {
		resp, err := admin.ListLedger(ctx, connect.NewRequest(&v1.ListLedgerRequest{Sku: spec.SKU, PageToken: token, PageSize: 10}))
		if err != nil {
			t.Fatalf("ListLedger(page %d) = %v", page, err)
		}
		sizes = append(sizes, len(resp.Msg.GetEntries()))
		for _, e := range resp.Msg.GetEntries() {
			ids = append(ids, e.GetId())
			if e.GetKind() != "deduct" || e.GetQuantity() != 1 || e.GetSoldAfter()-e.GetSoldBefore() != 1 || e.GetIdempotencyKey() == "" {
				t.Errorf("entry %v, want a deduct of 1 with its key", e)
			}
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(sizes) != 3 || sizes[0] != 10 || sizes[1] != 10 || sizes[2] != 5 {
		t.Errorf("pages of %v entries, want 10, 10, 5 and no token after the last", sizes)
	}
	for i, id := range ids {
		if id != int64(i+1) {
			t.Fatalf("ids %v, want 1 to %d in order", ids, deducts)
		}
	}
	if len(ids) != deducts {
		t.Errorf("%d entries, want %d", len(ids), deducts)
	}
	resp, err := admin.ListLedger(ctx, connect.NewRequest(&v1.ListLedgerRequest{Sku: spec.SKU, PageSize: 5000}))
	if err != nil || len(resp.Msg.GetEntries()) != deducts || resp.Msg.GetNextPageToken() != "" {
		t.Errorf("ListLedger(page size 5000) = %d entries, token %q, %v; want all %d, no token",
			len(resp.Msg.GetEntries()), resp.Msg.GetNextPageToken(), err, deducts)
	}
}

// TestServer_Reconcile checks that Reconcile finds books that do not
// balance: the check can fail.
func TestServer_Reconcile(t *testing.T) {
	ctx := context.Background()
	srv := New()
	c := client(t, startServer(t, srv))
	spec := newSKU(t, c, 10)
	if o := c.Deduct(ctx, spec.SKU, "rec-1", 2); !same(o, loadgen.OK) {
		t.Fatalf("Deduct(2) = %v", o)
	}
	if _, o := c.Reserve(ctx, spec.SKU, "rec-2", 3); !same(o, loadgen.OK) {
		t.Fatalf("Reserve(3) = %v", o)
	}
	wantCounts(t, verify(t, c, spec), 5, 3, 2)

	k, err := srv.lookup(spec.SKU)
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.counts.Sold++ // a sale without a ledger entry
	k.mu.Unlock()
	st, err := c.Verify(ctx, []loadgen.SKUSpec{spec})
	if err != nil {
		t.Fatalf("Verify() = %v", err)
	}
	checks := map[string]bool{}
	for _, d := range st.SKUs[spec.SKU].Discrepancies {
		checks[d.Check] = true
	}
	for _, want := range []string{ledger.CheckShardBalance, ledger.CheckConservation, "loadgen_ledger_sum"} {
		if !checks[want] {
			t.Errorf("Verify() discrepancies %+v lack %s", st.SKUs[spec.SKU].Discrepancies, want)
		}
	}
}

// TestServer_Concurrent sends the same keys to two SKUs at once, and more
// deducts than stock to one: each key applies once, the stock exactly.
func TestServer_Concurrent(t *testing.T) {
	ctx := context.Background()
	c := client(t, start(t))
	a, b := newSKU(t, c, 1000), newSKU(t, c, 1000)
	const keys = 100
	var wg sync.WaitGroup
	outcomes := make([][2]loadgen.Outcome, keys)
	for i := range keys {
		key := fmt.Sprintf("both-%d", i)
		wg.Go(func() { outcomes[i][0] = c.Deduct(ctx, a.SKU, key, 1) })
		wg.Go(func() { outcomes[i][1] = c.Deduct(ctx, b.SKU, key, 1) })
	}
	wg.Wait()
	reused := errOf(stock.CodeIdempotencyKeyReused)
	for i, o := range outcomes {
		if !(same(o[0], loadgen.OK) && same(o[1], reused) || same(o[0], reused) && same(o[1], loadgen.OK)) {
			t.Errorf("key %d on two SKUs at once = %v, %v; want one ok and one IDEMPOTENCY_KEY_REUSED", i, o[0], o[1])
		}
	}
	sa, sb := verify(t, c, a), verify(t, c, b)
	if sa.Sold+sb.Sold != keys {
		t.Errorf("sold %d + %d, want %d", sa.Sold, sb.Sold, keys)
	}

	hot := newSKU(t, c, 50)
	const deducts = 200
	var mu sync.Mutex
	got := map[loadgen.Status]int{}
	for i := range deducts {
		key := fmt.Sprintf("hot-%d", i)
		wg.Go(func() {
			o := c.Deduct(ctx, hot.SKU, key, 1)
			mu.Lock()
			got[o.Status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if got[loadgen.StatusOK] != 50 || got[loadgen.StatusOutOfStock] != deducts-50 {
		t.Errorf("%d deducts of 50 units = %v, want 50 ok, %d out of stock", deducts, got, deducts-50)
	}
	wantCounts(t, verify(t, c, hot), 0, 0, 50)
}

// runLoad drives a new server with the load generator's runner.
func runLoad(t *testing.T, cfg loadgen.Config) *loadgen.Result {
	t.Helper()
	c := client(t, start(t))
	r, err := loadgen.NewRunner(cfg)
	if err != nil {
		t.Fatalf("NewRunner(%+v) = %v", cfg, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := r.Run(ctx, c)
	if err != nil {
		t.Fatalf("Run() = %v", err)
	}
	if got := res.OK + res.Replayed + res.OutOfStock + res.Errors; got != res.Requests {
		t.Errorf("ok %d + replayed %d + oos %d + errors %d = %d, want requests %d", res.OK, res.Replayed, res.OutOfStock, res.Errors, got, res.Requests)
	}
	// Abandoned attempts are the runner's own doing; any other error is
	// the server's.
	for code, n := range res.ErrorsByCode {
		if code != loadgen.CodeAbandoned {
			t.Errorf("%d errors %s (samples %v), want none but %s", n, code, res.ErrorSamples, loadgen.CodeAbandoned)
		}
	}
	if c := res.Correctness; !c.Clean() || c.Unresolved != 0 {
		t.Errorf("correctness = %+v, want clean and resolved", c)
	}
	return res
}

func TestServer_Load(t *testing.T) {
	t.Run("Case", func(t *testing.T) {
		// No abandonment here: an abandoned first attempt whose retry
		// comes back a replay is a success the client never saw as ok, and
		// this subtest counts the oks. Model C below abandons.
		res := runLoad(t, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 32, DupRate: 0.2, Retry: true})
		if res.Flows != loadgen.CaseRequests || res.OK != loadgen.CaseStock {
			t.Errorf("flows %d, ok %d; want %d, %d", res.Flows, res.OK, loadgen.CaseRequests, loadgen.CaseStock)
		}
		s := res.State.SKUs[res.SKUs[0].SKU]
		if s.Available != 0 || s.Sold != loadgen.CaseStock || s.Ledger["deduct"] != loadgen.CaseStock || s.DistinctKeys != loadgen.CaseStock {
			t.Errorf("state = %+v, want available 0, sold %d in as many deduct entries and keys", s, loadgen.CaseStock)
		}
	})
	t.Run("C", func(t *testing.T) {
		res := runLoad(t, loadgen.Config{Model: loadgen.ModelC, SKUs: 20, Stock: 1000, Requests: 3000, Concurrency: 32,
			Duration: 30 * time.Second, Mix: loadgen.Mix{Deduct: 1, Commit: 1, Release: 1}, Qty: loadgen.QtyDist{Min: 1, Max: 3},
			DupRate: 0.1, AbandonRate: 0.1, Retry: true})
		if res.Flows != 3000 {
			t.Errorf("flows %d, want 3000", res.Flows)
		}
		for _, op := range []string{"deduct", "reserve", "commit", "release"} {
			if res.RequestsByOp[op] == 0 {
				t.Errorf("requests by op %v: no %s", res.RequestsByOp, op)
			}
		}
		if res.OutOfStock == 0 || res.Replayed == 0 || res.ErrorsByCode[loadgen.CodeAbandoned] == 0 {
			t.Errorf("oos %d, replayed %d, abandoned %d: want some of each (the hot SKU sells out, duplicates replay)",
				res.OutOfStock, res.Replayed, res.ErrorsByCode[loadgen.CodeAbandoned])
		}
		var stock0, total int64
		for _, spec := range res.SKUs {
			s := res.State.SKUs[spec.SKU]
			stock0 += spec.Stock
			total += s.Available + s.Reserved + s.Sold
		}
		if total != stock0 {
			t.Errorf("available + reserved + sold over all SKUs = %d, want the stock %d", total, stock0)
		}
	})
}

// TestServer_Halt: a change the planner finds would break an invariant
// (here: counts corrupted behind its back) halts the SKU: that change and
// every later one are refused INTERNAL, and nothing is written.
func TestServer_Halt(t *testing.T) {
	ctx := context.Background()
	srv := New()
	c := client(t, startServer(t, srv))
	spec := newSKU(t, c, 10)
	k, err := srv.lookup(spec.SKU)
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.counts.Reserved = -1 // no reservation can account for it
	entries := len(k.ledger)
	k.mu.Unlock()
	for i := range 2 {
		res := srv.Allocate(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: spec.SKU}, Quantity: 1, Key: fmt.Sprintf("halt-%d", i)})
		if res.Err == nil || res.Err.Code != stock.CodeInternal {
			t.Errorf("deduct #%d on a corrupted SKU = %+v, want INTERNAL", i, res)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.halted || len(k.ledger) != entries || k.counts.Available != 10 || srv.keys["halt-0"] != nil {
		t.Errorf("halted %v, %d entries (want %d), available %d, key bound %v: want halted and nothing written",
			k.halted, len(k.ledger), entries, k.counts.Available, srv.keys["halt-0"] != nil)
	}
}

// TestServer_ExpiredOnEnd: a held reservation found due by a commit or a
// release expires first, as shardstock's planner has it (the memory target
// has no sweeper): the commit is refused RESERVATION_EXPIRED, a release
// replays, and the units are back once.
func TestServer_ExpiredOnEnd(t *testing.T) {
	ctx := context.Background()
	srv := New()
	c := client(t, startServer(t, srv))
	spec := newSKU(t, c, 10)
	id, o := c.Reserve(ctx, spec.SKU, "due-1", 4)
	if !same(o, loadgen.OK) {
		t.Fatalf("Reserve(4) = %v", o)
	}
	k, err := srv.lookup(spec.SKU)
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.reservations[id].ExpiresAt = time.Now().Add(-time.Second)
	k.mu.Unlock()
	if o := c.Commit(ctx, id); !same(o, errOf(stock.CodeReservationExpired)) {
		t.Errorf("Commit(due) = %v, want RESERVATION_EXPIRED", o)
	}
	if o := c.Release(ctx, id); !same(o, loadgen.Replayed) {
		t.Errorf("Release(expired) = %v, want replayed", o)
	}
	s := verify(t, c, spec)
	wantCounts(t, s, 10, 0, 0)
	if s.Ledger["expire"] != 1 || s.Ledger["commit"] != 0 || s.Ledger["release"] != 0 {
		t.Errorf("ledger %v, want one expire entry and no other end", s.Ledger)
	}
}
