package shardstock_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	shardstockv1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/stock"
)

const token = "test-token"

// fakeAllocator serves the public API from memory, one mutex, one shard per
// SKU: a test double of the allocator, to check the client side (HTTP/2,
// replays, error reasons, abandonment, the admin token, ledger paging) until
// the real allocator can be started in tests.
type fakeAllocator struct {
	shardstockv1connect.UnimplementedInventoryServiceHandler
	shardstockv1connect.UnimplementedAdminServiceHandler

	mu         sync.Mutex
	prewarms   [][]string      // the SKUs of each Prewarm call
	coldShards map[string]bool // SKUs a Prewarm leaves one shard of cold
	skus       map[string]*fakeSKU
	ops        map[string]*shardstockv1.Operation // by sku + "|" + key
	holds      map[string]*shardstockv1.Reservation
	ledger     []*shardstockv1.LedgerEntry
	nextID     int
}

type fakeSKU struct {
	initial, available, reserved, sold int64
	shards                             int32
}

func newFake() *fakeAllocator {
	return &fakeAllocator{skus: map[string]*fakeSKU{}, ops: map[string]*shardstockv1.Operation{}, holds: map[string]*shardstockv1.Reservation{}}
}

func domainError(code connect.Code, reason stock.Code) error {
	e := connect.NewError(code, errors.New(string(reason)))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: string(reason), Domain: "shardstock"}); err == nil {
		e.AddDetail(d)
	}
	return e
}

func (f *fakeAllocator) entry(sku, kind, key, resID string, qty int64, before fakeSKU, after *fakeSKU) {
	f.ledger = append(f.ledger, &shardstockv1.LedgerEntry{
		Id: int64(len(f.ledger) + 1), Sku: sku, Kind: kind, Quantity: qty, IdempotencyKey: key, ReservationId: resID,
		AvailableBefore: before.available, AvailableAfter: after.available,
		ReservedBefore: before.reserved, ReservedAfter: after.reserved,
		SoldBefore: before.sold, SoldAfter: after.sold,
	})
}

func (f *fakeAllocator) take(kind shardstockv1.OperationKind, sku, key string, qty int64) (*shardstockv1.Operation, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.skus[sku]
	if !ok {
		return nil, false, domainError(connect.CodeNotFound, stock.CodeSKUNotFound)
	}
	if op, ok := f.ops[sku+"|"+key]; ok {
		return op, true, nil
	}
	if s.available < qty {
		return nil, false, domainError(connect.CodeFailedPrecondition, stock.CodeOutOfStock)
	}
	before := *s
	op := &shardstockv1.Operation{Sku: sku, IdempotencyKey: key, Kind: kind, Quantity: qty}
	s.available -= qty
	name := string(stock.OpDeduct)
	if kind == shardstockv1.OperationKind_OPERATION_KIND_RESERVE {
		name = string(stock.OpReserve)
		s.reserved += qty
		f.nextID++
		op.ReservationId = "r" + strconv.Itoa(f.nextID)
		f.holds[op.ReservationId] = &shardstockv1.Reservation{ReservationId: op.ReservationId, Sku: sku, Quantity: qty,
			State: shardstockv1.ReservationState_RESERVATION_STATE_HELD, IdempotencyKey: key}
	} else {
		s.sold += qty
	}
	f.ops[sku+"|"+key] = op
	f.entry(sku, name, key, op.ReservationId, qty, before, s)
	return op, false, nil
}

func (f *fakeAllocator) end(id string, to shardstockv1.ReservationState) (*shardstockv1.Reservation, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.holds[id]
	switch {
	case !ok:
		return nil, false, domainError(connect.CodeNotFound, stock.CodeReservationNotFound)
	case r.State == to:
		return r, true, nil
	case r.State == shardstockv1.ReservationState_RESERVATION_STATE_COMMITTED:
		return nil, false, domainError(connect.CodeFailedPrecondition, stock.CodeReservationAlreadyCommitted)
	case r.State == shardstockv1.ReservationState_RESERVATION_STATE_RELEASED:
		return nil, false, domainError(connect.CodeFailedPrecondition, stock.CodeReservationAlreadyReleased)
	}
	s := f.skus[r.Sku]
	before := *s
	r.State = to
	s.reserved -= r.Quantity
	kind := string(stock.OpCommit)
	if to == shardstockv1.ReservationState_RESERVATION_STATE_COMMITTED {
		s.sold += r.Quantity
	} else {
		kind = string(stock.OpRelease)
		s.available += r.Quantity
	}
	f.entry(r.Sku, kind, r.IdempotencyKey, id, r.Quantity, before, s)
	return r, false, nil
}

func (f *fakeAllocator) Deduct(_ context.Context, req *connect.Request[shardstockv1.DeductRequest]) (*connect.Response[shardstockv1.DeductResponse], error) {
	op, replayed, err := f.take(shardstockv1.OperationKind_OPERATION_KIND_DEDUCT, req.Msg.GetSku(), req.Msg.GetIdempotencyKey(), req.Msg.GetQuantity())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&shardstockv1.DeductResponse{Operation: op, Replayed: replayed}), nil
}

func (f *fakeAllocator) Reserve(_ context.Context, req *connect.Request[shardstockv1.ReserveRequest]) (*connect.Response[shardstockv1.ReserveResponse], error) {
	op, replayed, err := f.take(shardstockv1.OperationKind_OPERATION_KIND_RESERVE, req.Msg.GetSku(), req.Msg.GetIdempotencyKey(), req.Msg.GetQuantity())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&shardstockv1.ReserveResponse{
		Reservation: &shardstockv1.Reservation{ReservationId: op.ReservationId, Sku: op.Sku, Quantity: op.Quantity}, Replayed: replayed}), nil
}

func (f *fakeAllocator) Commit(_ context.Context, req *connect.Request[shardstockv1.CommitRequest]) (*connect.Response[shardstockv1.CommitResponse], error) {
	r, replayed, err := f.end(req.Msg.GetReservationId(), shardstockv1.ReservationState_RESERVATION_STATE_COMMITTED)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&shardstockv1.CommitResponse{Reservation: r, Replayed: replayed}), nil
}

func (f *fakeAllocator) Release(_ context.Context, req *connect.Request[shardstockv1.ReleaseRequest]) (*connect.Response[shardstockv1.ReleaseResponse], error) {
	r, replayed, err := f.end(req.Msg.GetReservationId(), shardstockv1.ReservationState_RESERVATION_STATE_RELEASED)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&shardstockv1.ReleaseResponse{Reservation: r, Replayed: replayed}), nil
}

func authorized(h http.Header) error {
	if h.Get("Authorization") != "Bearer "+token {
		return domainError(connect.CodeUnauthenticated, stock.CodeUnauthenticated)
	}
	return nil
}

func (f *fakeAllocator) CreateSku(_ context.Context, req *connect.Request[shardstockv1.CreateSkuRequest]) (*connect.Response[shardstockv1.CreateSkuResponse], error) {
	if err := authorized(req.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skus[req.Msg.GetSku()] = &fakeSKU{initial: req.Msg.GetInitialStock(), available: req.Msg.GetInitialStock(), shards: req.Msg.GetShards()}
	return connect.NewResponse(&shardstockv1.CreateSkuResponse{}), nil
}

func (f *fakeAllocator) Prewarm(_ context.Context, req *connect.Request[shardstockv1.PrewarmRequest]) (*connect.Response[shardstockv1.PrewarmResponse], error) {
	if err := authorized(req.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sku := range req.Msg.GetSkus() {
		if f.skus[sku] == nil {
			return nil, domainError(connect.CodeNotFound, stock.CodeSKUNotFound)
		}
	}
	f.prewarms = append(f.prewarms, req.Msg.GetSkus())
	resp := &shardstockv1.PrewarmResponse{}
	for _, sku := range req.Msg.GetSkus() {
		warm := f.skus[sku].shards
		if f.coldShards[sku] {
			warm-- // one of its shards' servers did not answer
		}
		resp.Skus = append(resp.Skus, &shardstockv1.PrewarmedSku{Sku: sku, ShardsWarm: warm})
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeAllocator) Reconcile(_ context.Context, req *connect.Request[shardstockv1.ReconcileRequest]) (*connect.Response[shardstockv1.ReconcileResponse], error) {
	if err := authorized(req.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.skus[req.Msg.GetSku()]
	if !ok {
		return nil, domainError(connect.CodeNotFound, stock.CodeSKUNotFound)
	}
	return connect.NewResponse(&shardstockv1.ReconcileResponse{
		Balanced: s.available+s.reserved+s.sold == s.initial,
		Stock:    &shardstockv1.Stock{Sku: req.Msg.GetSku(), Available: s.available, Reserved: s.reserved, Sold: s.sold},
	}), nil
}

// ListLedger pages by entry index, 7 entries a page whatever is asked, to
// exercise paging.
func (f *fakeAllocator) ListLedger(_ context.Context, req *connect.Request[shardstockv1.ListLedgerRequest]) (*connect.Response[shardstockv1.ListLedgerResponse], error) {
	if err := authorized(req.Header()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	from, _ := strconv.Atoi(req.Msg.GetPageToken())
	resp := &shardstockv1.ListLedgerResponse{}
	i := from
	for ; i < len(f.ledger) && len(resp.Entries) < 7; i++ {
		if e := f.ledger[i]; e.Sku == req.Msg.GetSku() {
			resp.Entries = append(resp.Entries, e)
		}
	}
	if i < len(f.ledger) {
		resp.NextPageToken = strconv.Itoa(i)
	}
	return connect.NewResponse(resp), nil
}

// serve starts the fake on 127.0.0.1 with cleartext HTTP/2.
func serve(t *testing.T, f *fakeAllocator) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(shardstockv1connect.NewInventoryServiceHandler(f))
	mux.Handle(shardstockv1connect.NewAdminServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func runOn(t *testing.T, target loadgen.Target, cfg loadgen.Config) *loadgen.Result {
	t.Helper()
	cfg.Duration = 10 * time.Second
	r, err := loadgen.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := r.Run(ctx, target)
	if err != nil {
		t.Fatalf("Run() = %v", err)
	}
	if err := target.Close(); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestTarget_Case(t *testing.T) {
	f := newFake()
	res := runOn(t, shardstock.New(shardstock.Config{Addr: serve(t, f), AdminToken: token}), loadgen.Config{Model: loadgen.ModelCase, Concurrency: 32})
	if res.OK != 100 || res.OK+res.Replayed+res.OutOfStock != 500 || res.Errors != 0 {
		t.Errorf("ok %d, replayed %d, oos %d, errors %v; want 100 successes of 500 and no error", res.OK, res.Replayed, res.OutOfStock, res.ErrorsByCode)
	}
	if c := res.Correctness; !c.Clean() {
		t.Errorf("correctness = %+v, want clean", c)
	}
	st := res.State.SKUs[res.SKUs[0].SKU]
	if st.Ledger["deduct"] != 100 || st.DistinctKeys != 100 || st.Operations != 100 {
		t.Errorf("state %+v, want 100 deduct entries for 100 keys (ledger read over pages)", st)
	}
}

func TestTarget_Faults(t *testing.T) {
	f := newFake()
	cfg := loadgen.Config{Model: loadgen.ModelB, SKUs: 5, Stock: 200, Requests: 1000, Concurrency: 16,
		Mix: loadgen.Mix{Deduct: 1, Commit: 1, Release: 1}, DupRate: 0.2, AbandonRate: 0.3}
	res := runOn(t, shardstock.New(shardstock.Config{Addr: serve(t, f), AdminToken: token}), cfg)
	t.Logf("requests %d by op %v, ok %d, replayed %d, oos %d, errors %v", res.Requests, res.RequestsByOp, res.OK, res.Replayed, res.OutOfStock, res.ErrorsByCode)
	if res.ErrorsByCode[loadgen.CodeAbandoned] == 0 {
		t.Errorf("errors %v: no abandoned request", res.ErrorsByCode)
	}
	if res.OutOfStock == 0 {
		t.Errorf("no out-of-stock answer: OUT_OF_STOCK reason not recognised? errors %v", res.ErrorsByCode)
	}
	if c := res.Correctness; !c.Clean() || c.Unresolved != 0 {
		t.Errorf("correctness = %+v, want clean and resolved", c)
	}
}

func TestTarget_Setup(t *testing.T) {
	fake := newFake()
	url := serve(t, fake)
	t.Run("Prewarm", func(t *testing.T) {
		// Every SKU prewarmed once it exists, at most 100 a call (the
		// API's bound); without Prewarm, none.
		var specs []loadgen.SKUSpec
		for i := range 250 {
			specs = append(specs, loadgen.SKUSpec{SKU: "pw-" + strconv.Itoa(i), Stock: 1, Shards: 1})
		}
		if err := shardstock.New(shardstock.Config{Addr: url, AdminToken: token}).Setup(context.Background(), specs[:10]); err != nil {
			t.Fatalf("Setup = %v", err)
		}
		if len(fake.prewarms) != 0 {
			t.Fatalf("Setup without Prewarm prewarmed %v, want nothing", fake.prewarms)
		}
		if err := shardstock.New(shardstock.Config{Addr: url, AdminToken: token, Prewarm: true}).Setup(context.Background(), specs); err != nil {
			t.Fatalf("Setup with Prewarm = %v", err)
		}
		seen := map[string]int{}
		for _, call := range fake.prewarms {
			if len(call) == 0 || len(call) > api.PrewarmSKUsMax {
				t.Errorf("a Prewarm call of %d SKUs, want 1 to %d", len(call), api.PrewarmSKUsMax)
			}
			for _, sku := range call {
				seen[sku]++
			}
		}
		for _, s := range specs {
			if seen[s.SKU] != 1 {
				t.Errorf("SKU %s prewarmed %d times, want once", s.SKU, seen[s.SKU])
			}
		}
		// A SKU left with a cold shard fails the setup, naming it.
		fake.mu.Lock()
		fake.coldShards = map[string]bool{"pw-cold": true}
		fake.mu.Unlock()
		cold := []loadgen.SKUSpec{{SKU: "pw-warm", Stock: 1, Shards: 2}, {SKU: "pw-cold", Stock: 1, Shards: 2}}
		if err := shardstock.New(shardstock.Config{Addr: url, AdminToken: token, Prewarm: true}).Setup(context.Background(), cold); err == nil || !strings.Contains(err.Error(), "1 of the 2 shards of pw-cold") {
			t.Errorf("Setup with Prewarm, a shard of pw-cold not warmed = %v, want that said", err)
		}
	})
	t.Run("Unauthenticated", func(t *testing.T) {
		err := shardstock.New(shardstock.Config{Addr: url, AdminToken: "wrong"}).Setup(context.Background(), []loadgen.SKUSpec{{SKU: "a", Stock: 1, Shards: 1}})
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("Setup(wrong token) = %v, want unauthenticated", err)
		}
	})
	t.Run("NotRunning", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := shardstock.New(shardstock.Config{Addr: "http://127.0.0.1:1"}).Setup(ctx, []loadgen.SKUSpec{{SKU: "a", Stock: 1, Shards: 1}})
		if err == nil {
			t.Errorf("Setup(nothing listening) = nil, want an error")
		}
	})
	t.Run("Errors", func(t *testing.T) {
		target := shardstock.New(shardstock.Config{Addr: url, AdminToken: token})
		ctx := context.Background()
		if o := target.Deduct(ctx, "missing", "k", 1); o.Status != loadgen.StatusError || o.Code != string(stock.CodeSKUNotFound) {
			t.Errorf("Deduct(missing SKU) = %v, want SKU_NOT_FOUND", o)
		}
		if o := target.Commit(ctx, "nope"); o.Status != loadgen.StatusError || o.Code != string(stock.CodeReservationNotFound) {
			t.Errorf("Commit(nope) = %v, want RESERVATION_NOT_FOUND", o)
		}
	})
}

// TestTarget_Verify checks what Verify reads from the ledger: one deduct or
// reserve entry per key wherever it landed, one end entry per reservation,
// and opening stock plus every entry's change against the counts.
func TestTarget_Verify(t *testing.T) {
	setup := func(t *testing.T) (*fakeAllocator, *shardstock.Target, []loadgen.SKUSpec) {
		t.Helper()
		f := newFake()
		target := shardstock.New(shardstock.Config{Addr: serve(t, f), AdminToken: token})
		skus := []loadgen.SKUSpec{{SKU: "v", Stock: 10, Shards: 2}}
		ctx := context.Background()
		if err := target.Setup(ctx, skus); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if o := target.Deduct(ctx, "v", "k"+strconv.Itoa(i), 1); o.Status != loadgen.StatusOK {
				t.Fatalf("Deduct(k%d) = %v, want ok", i, o)
			}
		}
		id, o := target.Reserve(ctx, "v", "r", 2)
		if o.Status != loadgen.StatusOK {
			t.Fatalf("Reserve(r) = %v, want ok", o)
		}
		if o := target.Commit(ctx, id); o.Status != loadgen.StatusOK {
			t.Fatalf("Commit(%s) = %v, want ok", id, o)
		}
		return f, target, skus
	}
	verify := func(t *testing.T, target *shardstock.Target, skus []loadgen.SKUSpec) loadgen.SKUState {
		t.Helper()
		st, err := target.Verify(context.Background(), skus)
		if err != nil {
			t.Fatalf("Verify() = %v", err)
		}
		return st.SKUs["v"]
	}
	// again appends a copy of the ledger's entry i, on shard and with the
	// counts moved as the copy says, as a system applying it twice would.
	again := func(f *fakeAllocator, i int, shard int32) {
		f.mu.Lock()
		defer f.mu.Unlock()
		e := proto.Clone(f.ledger[i]).(*shardstockv1.LedgerEntry)
		e.Id, e.Shard = int64(len(f.ledger)+1), shard
		f.ledger = append(f.ledger, e)
	}

	t.Run("OK", func(t *testing.T) {
		_, target, skus := setup(t)
		s := verify(t, target, skus)
		if s.Operations != 4 || s.DistinctKeys != 4 || s.ExtraEnds != 0 || len(s.Discrepancies) != 0 {
			t.Errorf("Verify() = %+v, want 4 operations of 4 keys, no extra end, no discrepancy", s)
		}
		if s.Ledger["deduct"] != 3 || s.Ledger["reserve"] != 1 || s.Ledger["commit"] != 1 {
			t.Errorf("Verify() ledger = %v, want deduct=3 reserve=1 commit=1", s.Ledger)
		}
		if k := s.Keys["k0"]; k != (loadgen.KeyRecord{Kind: "deduct", Applied: 1}) || len(s.Keys) != 4 {
			t.Errorf("Verify() keys = %+v, want k0 deducted once among 4 keys", s.Keys)
		}
		r := s.Keys["r"]
		if r.Kind != "reserve" || r.Applied != 1 || r.ReservationID == "" ||
			s.Reservations[r.ReservationID] != (loadgen.ReservationRecord{Committed: 1}) {
			t.Errorf("Verify() key r = %+v, reservations %+v, want one reserve, committed once", r, s.Reservations)
		}
	})
	t.Run("KeyOnAnotherShard", func(t *testing.T) {
		f, target, skus := setup(t)
		again(f, 0, 1) // deduct k0, again, on shard 1
		s := verify(t, target, skus)
		if s.Operations-s.DistinctKeys != 1 {
			t.Errorf("Verify() = %d operations of %d keys, want one more operation than keys", s.Operations, s.DistinctKeys)
		}
		if s.Keys["k0"].Applied != 2 {
			t.Errorf("Verify() key k0 = %+v, want applied twice", s.Keys["k0"])
		}
	})
	t.Run("EndedTwice", func(t *testing.T) {
		f, target, skus := setup(t)
		again(f, 4, 0) // the commit
		s := verify(t, target, skus)
		if s.ExtraEnds != 1 {
			t.Errorf("Verify() ExtraEnds = %d, want 1", s.ExtraEnds)
		}
		if r := s.Reservations[s.Keys["r"].ReservationID]; r.Committed != 2 {
			t.Errorf("Verify() reservation of r = %+v, want committed twice", r)
		}
	})
	t.Run("LedgerSum", func(t *testing.T) {
		f, target, skus := setup(t)
		again(f, 1, 0) // an entry that moved counts the rows never saw
		s := verify(t, target, skus)
		var found bool
		for _, d := range s.Discrepancies {
			found = found || d.Check == "loadgen_ledger_sum"
		}
		if !found {
			t.Errorf("Verify() discrepancies = %+v, want a loadgen_ledger_sum one", s.Discrepancies)
		}
	})
}

// TestTarget_Tokens checks which credential each service is called with:
// the InventoryService with the service token, as the services the load
// stands for call it (an admin's stock calls are each logged at info, a
// cost no service's call has), and with the admin token only when no
// service token is given; the AdminService always with the admin token.
func TestTarget_Tokens(t *testing.T) {
	const service = "service-token"
	f := newFake()
	var mu sync.Mutex
	seen := map[string]map[string]bool{} // service name -> bearer tokens
	mux := http.NewServeMux()
	mux.Handle(shardstockv1connect.NewInventoryServiceHandler(f))
	mux.Handle(shardstockv1connect.NewAdminServiceHandler(f))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")[0]
		mu.Lock()
		if seen[name] == nil {
			seen[name] = map[string]bool{}
		}
		seen[name][strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")] = true
		mu.Unlock()
		if name == shardstockv1connect.InventoryServiceName && r.Header.Get("Authorization") == "Bearer "+service {
			r.Header.Set("Authorization", "Bearer "+token) // the fake knows one token
		}
		mux.ServeHTTP(w, r)
	}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name, service, wantInventory string
	}{
		{"Service", service, service},
		{"AdminActsAsService", "", token},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			clear(seen)
			mu.Unlock()
			target := shardstock.New(shardstock.Config{Addr: srv.URL, AdminToken: token, ServiceToken: tc.service})
			ctx := context.Background()
			sku := "tokens-" + tc.name
			if err := target.Setup(ctx, []loadgen.SKUSpec{{SKU: sku, Stock: 5, Shards: 1}}); err != nil {
				t.Fatalf("Setup() = %v", err)
			}
			if o := target.Deduct(ctx, sku, "k", 1); o.Status != loadgen.StatusOK {
				t.Fatalf("Deduct() = %v, want ok", o)
			}
			mu.Lock()
			defer mu.Unlock()
			inv, adm := seen[shardstockv1connect.InventoryServiceName], seen[shardstockv1connect.AdminServiceName]
			if len(inv) != 1 || !inv[tc.wantInventory] {
				t.Errorf("InventoryService called with tokens %v, want only %q", inv, tc.wantInventory)
			}
			if len(adm) != 1 || !adm[token] {
				t.Errorf("AdminService called with tokens %v, want only the admin token", adm)
			}
		})
	}
}
