package allocatorcmd_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/auth/authtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// publicToken is a public role's bearer token (an app's: no customer).
const publicToken = "allocatorcmd-public-token"

// bearer sends credential as a bearer token.
var bearer = authtest.Bearer

// protocols are the three the public port speaks; gRPC-Web is a
// browser's.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{{"Connect", nil}, {"gRPC", []connect.ClientOption{connect.WithGRPC()}}, {"gRPCWeb", []connect.ClientOption{connect.WithGRPCWeb()}}}

// startWithJWKS starts an allocator with its own shard server, the test's
// tokens and a JWKS of iss's, and waits until it is ready.
func startWithJWKS(t *testing.T, iss *authtest.KeyIssuer, extra ...string) string {
	t.Helper()
	return startWithJWKSOn(t, pgtest.NewMigratedDB(t), iss, extra...)
}

// startWithJWKSOn is startWithJWKS with url as the main database.
func startWithJWKSOn(t *testing.T, url string, iss *authtest.KeyIssuer, extra ...string) string {
	t.Helper()
	base, _ := startOn(t, url, append([]string{"-shard-id", "own", "-lease-ttl", "2s", "-public-token", publicToken,
		"-jwks", iss.WriteJWKS(t), "-jwt-issuer", authtest.Issuer, "-jwt-audience", authtest.Audience}, extra...)...)
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	return base
}

// TestRun_Roles: over Connect, gRPC and gRPC-Web, a caller without a
// credential and a public one (token or JWT) are refused every call that
// changes stock and every admin call, UNAUTHENTICATED or
// PERMISSION_DENIED, and nothing changes; GetStock shows them no server,
// halt, transfer or mover. A service credential (token or JWT) makes the
// shop's calls and no admin call; an admin one makes both. The ledger
// names each caller by role and credential id, never the secret.
func TestRun_Roles(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "key-1")
	base := startWithJWKS(t, iss)
	hc := transport.NewClient()
	const sku = "roles"
	admin := shardstockv1connect.NewAdminServiceClient(hc, base, bearer(token))
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: sku, InitialStock: 100, Shards: 2})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	service := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(serviceToken))
	held, err := service.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: "held"}))
	if err != nil {
		t.Fatalf("Reserve by the service = %v", err)
	}
	rid := held.Msg.GetReservation().GetReservationId()
	operator := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(token))
	snapshot := func() (*v1.Stock, int) {
		t.Helper()
		st, err := operator.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg.GetStock(), len(ledgerOf(t, admin, sku))
	}
	stockBefore, entriesBefore := snapshot()
	adminMethods := v1.File_shardstock_v1_admin_proto.Services().ByName("AdminService").Methods()

	type refusedCall struct {
		name string
		call func(c shardstockv1connect.InventoryServiceClient) error
	}
	stockCalls := []refusedCall{
		{"Replenish", func(c shardstockv1connect.InventoryServiceClient) error {
			_, err := c.Replenish(ctx, connect.NewRequest(&v1.ReplenishRequest{Sku: sku, Quantity: 1_000_000, IdempotencyKey: "free-stock"}))
			return err
		}},
		{"Deduct", func(c shardstockv1connect.InventoryServiceClient) error {
			_, err := c.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: "no-order"}))
			return err
		}},
		{"Reserve", func(c shardstockv1connect.InventoryServiceClient) error {
			_, err := c.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: "hoard"}))
			return err
		}},
		{"Commit", func(c shardstockv1connect.InventoryServiceClient) error {
			_, err := c.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: rid}))
			return err
		}},
		{"Release", func(c shardstockv1connect.InventoryServiceClient) error {
			_, err := c.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: rid}))
			return err
		}},
		{"GetOperation", func(c shardstockv1connect.InventoryServiceClient) error {
			_, err := c.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: sku, IdempotencyKey: "held"}))
			return err
		}},
	}
	// adminCall calls an AdminService method with an empty message (any
	// message's valid encoding): a refusal comes before it is decoded.
	adminCall := func(name string, credential string, opts []connect.ClientOption) error {
		c := connect.NewClient[emptypb.Empty, emptypb.Empty](hc, base+"/"+shardstockv1connect.AdminServiceName+"/"+name, append(opts, bearer(credential))...)
		_, err := c.CallUnary(ctx, connect.NewRequest(&emptypb.Empty{}))
		return err
	}
	expect := func(t *testing.T, what string, err error, code connect.Code) {
		t.Helper()
		if connect.CodeOf(err) != code {
			t.Errorf("%s = %v, want %v", what, err, code)
		}
	}
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			for _, caller := range []struct{ name, credential string }{
				{"Anonymous", ""}, {"PublicToken", publicToken}, {"PublicJWT", iss.Sign(t, auth.RolePublic, "alice")},
			} {
				want := connect.CodePermissionDenied
				if caller.credential == "" {
					want = connect.CodeUnauthenticated
				}
				inv := shardstockv1connect.NewInventoryServiceClient(hc, base, append(p.opts, bearer(caller.credential))...)
				for _, c := range stockCalls {
					expect(t, caller.name+" "+c.name, c.call(inv), want)
				}
				for i := range adminMethods.Len() {
					name := string(adminMethods.Get(i).Name())
					expect(t, caller.name+" AdminService/"+name, adminCall(name, caller.credential, p.opts), want)
				}
				st, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
				if err != nil {
					t.Fatalf("%s GetStock = %v", caller.name, err)
				}
				if got := st.Msg.GetStock(); got.GetAvailable() != stockBefore.GetAvailable() || got.GetMover() != nil || len(got.GetMoving()) != 0 ||
					len(got.GetShards()) != 2 || got.GetShards()[0].GetServerId() != "" || got.GetShards()[1].GetServerId() != "" {
					t.Errorf("%s GetStock = %v, want the counts without servers, transfers or mover", caller.name, got)
				}
			}
			// A bad credential is refused even for a read.
			forged := authtest.NewIssuer(t, "key-1").Sign(t, auth.RoleAdmin, "mallory")
			expect(t, "GetStock with a forged JWT", func() error {
				_, err := shardstockv1connect.NewInventoryServiceClient(hc, base, append(p.opts, bearer(forged))...).
					GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
				return err
			}(), connect.CodeUnauthenticated)
			for _, credential := range []string{serviceToken, iss.Sign(t, auth.RoleService, "orders")} {
				for i := range adminMethods.Len() {
					name := string(adminMethods.Get(i).Name())
					expect(t, "service AdminService/"+name, adminCall(name, credential, p.opts), connect.CodePermissionDenied)
				}
			}
		})
	}
	if st, entries := snapshot(); st.GetAvailable() != stockBefore.GetAvailable() || st.GetReserved() != stockBefore.GetReserved() ||
		st.GetSold() != stockBefore.GetSold() || entries != entriesBefore {
		t.Fatalf("after the refused calls: stock %v and %d ledger entries, want %v and %d: a refused call must change nothing", st, entries, stockBefore, entriesBefore)
	}

	// The service's flow works over each protocol, with a token and a
	// JWT; the admin's too, and the admin may act as a service.
	serviceJWT := iss.Sign(t, auth.RoleService, "orders")
	for _, p := range protocols {
		for _, who := range []struct{ name, credential string }{{"ServiceToken", serviceToken}, {"ServiceJWT", serviceJWT}, {"Admin", token}} {
			inv := shardstockv1connect.NewInventoryServiceClient(hc, base, append(p.opts, bearer(who.credential))...)
			key := fmt.Sprintf("%s-%s", p.name, who.name)
			r, err := inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: key + "-r"}))
			if err != nil {
				t.Fatalf("%s over %s: Reserve = %v", who.name, p.name, err)
			}
			if _, err := inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: r.Msg.GetReservation().GetReservationId()})); err != nil {
				t.Errorf("%s over %s: Commit = %v", who.name, p.name, err)
			}
			if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: key + "-d"})); err != nil {
				t.Errorf("%s over %s: Deduct = %v", who.name, p.name, err)
			}
			if _, err := inv.Replenish(ctx, connect.NewRequest(&v1.ReplenishRequest{Sku: sku, Quantity: 1, IdempotencyKey: key + "-p"})); err != nil {
				t.Errorf("%s over %s: Replenish = %v", who.name, p.name, err)
			}
			if _, err := inv.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: sku, IdempotencyKey: key + "-d"})); err != nil {
				t.Errorf("%s over %s: GetOperation = %v", who.name, p.name, err)
			}
		}
		adm := shardstockv1connect.NewAdminServiceClient(hc, base, append(p.opts, bearer(token))...)
		if _, err := adm.AdjustStock(ctx, connect.NewRequest(&v1.AdjustStockRequest{Sku: sku, Delta: 5, Reason: "found a box", Approver: "alice",
			IdempotencyKey: "adjust-" + p.name})); err != nil {
			t.Errorf("admin over %s: AdjustStock = %v", p.name, err)
		}
	}
	if _, err := service.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: rid})); err != nil {
		t.Errorf("service Release = %v", err)
	}
	// A refund and an extension change stock too: they name their caller.
	if _, err := service.Refund(ctx, connect.NewRequest(&v1.RefundRequest{Sku: sku, IdempotencyKey: "refund-1", Quantity: 1,
		Original: &v1.Sale{Sale: &v1.Sale_DeductKey{DeductKey: protocols[0].name + "-ServiceToken-d"}}})); err != nil {
		t.Errorf("service Refund = %v", err)
	}
	// An order's lines are taken and ended by the allocator (source
	// order): each line's entries name the order's caller.
	placed, err := service.ReserveOrder(ctx, connect.NewRequest(&v1.ReserveOrderRequest{IdempotencyKey: "order-1",
		Lines: []*v1.OrderLine{{Sku: sku, Quantity: 2}}}))
	if err != nil {
		t.Fatalf("service ReserveOrder = %v", err)
	}
	if _, err := service.CommitOrder(ctx, connect.NewRequest(&v1.CommitOrderRequest{OrderId: placed.Msg.GetOrder().GetOrderId()})); err != nil {
		t.Errorf("service CommitOrder = %v", err)
	}
	// The ledger names every caller, never a secret.
	callers, orderLines := map[string]int{}, map[string]int{}
	for _, e := range ledgerOf(t, admin, sku) {
		for _, secret := range []string{serviceToken, token, serviceJWT} {
			if strings.Contains(e.GetCaller(), secret) || strings.Contains(e.GetSource(), secret) {
				t.Errorf("ledger entry %d names a secret: caller %q source %q", e.GetId(), e.GetCaller(), e.GetSource())
			}
		}
		if e.GetSource() == stock.SourceOrder {
			orderLines[e.GetKind()+" "+e.GetCaller()]++
			continue
		}
		callers[e.GetKind()+" "+e.GetCaller()]++
	}
	svcToken, svcJWT, adm := "service:"+auth.TokenID(serviceToken), "service:jwt:orders", "admin:"+auth.TokenID(token)
	if want := map[string]int{"reserve " + svcToken: 1, "commit " + svcToken: 1}; !maps.Equal(orderLines, want) {
		t.Errorf("the order line's ledger entries %v, want %v: each names the order's caller", orderLines, want)
	}
	for entry, want := range map[string]int{
		"reserve " + svcToken: 4, "commit " + svcToken: 3, "release " + svcToken: 1, "deduct " + svcToken: 3, "replenish " + svcToken: 3,
		"refund " + svcToken: 1,
		"reserve " + svcJWT:  3, "deduct " + svcJWT: 3, "replenish " + svcJWT: 3,
		"reserve " + adm: 3, "deduct " + adm: 3, "adjust " + adm: 3,
	} {
		if callers[entry] != want {
			t.Errorf("ledger entries %q: %d, want %d (all: %v)", entry, callers[entry], want, callers)
		}
	}
}

// TestRun_CustomerLimits: with Deduct opened to the public role, two
// browsers that send the same customerRef but hold JWTs of different
// customers are each counted as their own customer; a public caller
// without a verified customer may not make the call.
func TestRun_CustomerLimits(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "key-1")
	base := startWithJWKS(t, iss, "-public-calls", "Deduct")
	hc := transport.NewClient()
	admin := shardstockv1connect.NewAdminServiceClient(hc, base, bearer(token))
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "limited", InitialStock: 100, Shards: 2, CustomerLimit: 1})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	deduct := func(credential, key string) error {
		inv := shardstockv1connect.NewInventoryServiceClient(hc, base, connect.WithGRPCWeb(), bearer(credential))
		_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "limited", Quantity: 1, IdempotencyKey: key, CustomerRef: "same-customer"}))
		return err
	}
	alice, bob := iss.Sign(t, auth.RolePublic, "alice"), iss.Sign(t, auth.RolePublic, "bob")
	if err := deduct(alice, "alice-1"); err != nil {
		t.Fatalf("alice's first Deduct = %v", err)
	}
	if err := deduct(bob, "bob-1"); err != nil {
		t.Errorf("bob's first Deduct, with alice's customerRef = %v, want success: bob is his own customer", err)
	}
	if err := deduct(alice, "alice-2"); wire.Reason(err) != string(stock.CodeCustomerLimitReached) {
		t.Errorf("alice's second Deduct = %v, want CUSTOMER_LIMIT_REACHED", err)
	}
	if err := deduct("", "anonymous-1"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("an anonymous Deduct = %v, want unauthenticated (no verified customer)", err)
	}
	if err := deduct(publicToken, "app-1"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("a Deduct with a public token = %v, want permission_denied (no verified customer)", err)
	}
	service := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(serviceToken))
	for key, want := range map[string]string{"alice-1": "alice", "bob-1": "bob"} {
		op, err := service.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: "limited", IdempotencyKey: key}))
		if err != nil || op.Msg.GetOperation().GetCustomerRef() != want {
			t.Errorf("GetOperation(%s) = %v, %v, want customer %s", key, op, err, want)
		}
	}
}

// ledgerOf lists a SKU's whole ledger.
func ledgerOf(t *testing.T, admin shardstockv1connect.AdminServiceClient, sku string) []*v1.LedgerEntry {
	t.Helper()
	var out []*v1.LedgerEntry
	page := ""
	for {
		resp, err := admin.ListLedger(context.Background(), connect.NewRequest(&v1.ListLedgerRequest{Sku: sku, PageToken: page, PageSize: 1000}))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp.Msg.GetEntries()...)
		if page = resp.Msg.GetNextPageToken(); page == "" {
			return out
		}
	}
}
