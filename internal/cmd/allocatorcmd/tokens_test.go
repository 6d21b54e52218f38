package allocatorcmd_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/auth/authtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// admitWithin bounds how long a waiting ticket takes to be admitted once a
// unit comes back: the worker's passes run every 100 ms, and its lease
// is taken within a pass of the SKU's first ticket.
const admitWithin = 10 * time.Second

// tokenSKU is the admission a drop of stock units gets in these tests:
// one token per customer, room for a few waiting tickets.
func tokenSKU(sku string, stock int64) *v1.CreateSkuRequest {
	return &v1.CreateSkuRequest{Sku: sku, InitialStock: stock, Shards: 1, Admission: &v1.Admission{
		Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, WaitlistMax: 10, TokensPerCustomer: 1}}
}

// expectReason fails the test unless err carries the documented reason.
func expectReason(t *testing.T, what string, err error, want stock.Code) {
	t.Helper()
	if wire.Reason(err) != string(want) {
		t.Errorf("%s = %v, want %s", what, err, want)
	}
}

// TestRun_Tokens: over Connect, gRPC and gRPC-Web, a browser's public JWT
// customer gets a purchase token, and a public caller without a verified
// customer is refused RequestToken. A second customer waits; WatchTicket
// streams its ticket from WAITING to ADMITTED once the service releases
// the first token, and the service commits the second. GetTicket reads a
// ticket by id and by sku and key (a public caller only its own), and
// CancelTicket takes a ticket out. A plain Reserve or Deduct is
// TOKEN_REQUIRED, and CUSTOMER_LIMIT_REACHED counts the JWT's customer,
// never the body's customerRef.
func TestRun_Tokens(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "key-1")
	base := startWithJWKS(t, iss)
	hc := transport.NewClient()
	admin := shardstockv1connect.NewAdminServiceClient(hc, base, bearer(token))
	alice, bob, carol, dave := iss.Sign(t, auth.RolePublic, "alice"), iss.Sign(t, auth.RolePublic, "bob"),
		iss.Sign(t, auth.RolePublic, "carol"), iss.Sign(t, auth.RolePublic, "dave")
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			sku := "drop-" + p.name
			if _, err := admin.CreateSku(ctx, connect.NewRequest(tokenSKU(sku, 1))); err != nil {
				t.Fatalf("CreateSku = %v", err)
			}
			client := func(credential string) shardstockv1connect.InventoryServiceClient {
				return shardstockv1connect.NewInventoryServiceClient(hc, base, append(append([]connect.ClientOption{}, p.opts...), bearer(credential))...)
			}
			request := func(credential, key, customerRef string) (*v1.RequestTokenResponse, error) {
				r, err := client(credential).RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: sku, Quantity: 1, IdempotencyKey: key, CustomerRef: customerRef}))
				if err != nil {
					return nil, err
				}
				return r.Msg, nil
			}
			service := client(serviceToken)

			if _, err := request("", "anonymous", "alice"); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("anonymous RequestToken = %v, want unauthenticated", err)
			}
			if _, err := request(publicToken, "app", "alice"); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("RequestToken with a public token (no verified customer) = %v, want permission_denied", err)
			}
			// alice names bob in the body: the JWT's customer is the one
			// counted.
			first, err := request(alice, "alice-1", "bob")
			if err != nil || first.GetToken().GetTokenId() == "" || first.GetToken().GetQuantity() != 1 {
				t.Fatalf("alice's RequestToken = %v, %v, want a token of 1", first, err)
			}
			again, err := request(alice, "alice-1", "bob")
			if err != nil || !again.GetReplayed() || again.GetToken().GetTokenId() != first.GetToken().GetTokenId() {
				t.Errorf("alice's RequestToken again = %v, %v, want the same token, replayed", again, err)
			}
			_, err = request(alice, "alice-2", "nobody")
			expectReason(t, "alice's second RequestToken, naming another customer", err, stock.CodeCustomerLimitReached)
			// bob names alice, who is at her limit: bob is counted.
			waiting, err := request(bob, "bob-1", "alice")
			if err != nil || waiting.GetTicket().GetState() != v1.TicketState_TICKET_STATE_WAITING || waiting.GetTicket().GetPosition() != 0 {
				t.Fatalf("bob's RequestToken naming alice = %v, %v, want a ticket WAITING at position 0", waiting, err)
			}
			ticketID := waiting.GetTicket().GetTicketId()
			behind, err := request(carol, "carol-1", "")
			if err != nil || behind.GetTicket().GetPosition() != 1 {
				t.Fatalf("carol's RequestToken = %v, %v, want a ticket WAITING at position 1", behind, err)
			}

			if got, err := client(bob).GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{TicketId: ticketID})); err != nil ||
				got.Msg.GetTicket().GetState() != v1.TicketState_TICKET_STATE_WAITING || got.Msg.GetTicket().GetIdempotencyKey() != "bob-1" {
				t.Errorf("GetTicket by id = %v, %v, want bob's ticket WAITING", got, err)
			}
			if got, err := client(bob).GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{Sku: sku, IdempotencyKey: "bob-1"})); err != nil ||
				got.Msg.GetTicket().GetTicketId() != ticketID {
				t.Errorf("bob's GetTicket by sku and key = %v, %v, want ticket %s", got, err, ticketID)
			}
			_, err = client(alice).GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{Sku: sku, IdempotencyKey: "bob-1"}))
			expectReason(t, "alice's GetTicket of bob's key", err, stock.CodeTicketNotFound)
			_, err = client(alice).CancelTicket(ctx, connect.NewRequest(&v1.CancelTicketRequest{TicketId: ticketID}))
			expectReason(t, "alice's CancelTicket of bob's ticket", err, stock.CodeTicketNotFound)
			if got, err := client(carol).CancelTicket(ctx, connect.NewRequest(&v1.CancelTicketRequest{TicketId: behind.GetTicket().GetTicketId()})); err != nil ||
				got.Msg.GetTicket().GetState() != v1.TicketState_TICKET_STATE_CANCELLED {
				t.Errorf("carol's CancelTicket = %v, %v, want CANCELLED", got, err)
			}

			_, err = service.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: sku, Quantity: 1, IdempotencyKey: "plain-r"}))
			expectReason(t, "a plain Reserve", err, stock.CodeTokenRequired)
			_, err = service.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: "plain-d"}))
			expectReason(t, "a plain Deduct", err, stock.CodeTokenRequired)

			// bob watches his ticket; the service releases alice's token
			// once the stream has shown him waiting.
			wctx, cancel := context.WithTimeout(ctx, admitWithin)
			defer cancel()
			stream, err := client(bob).WatchTicket(wctx, connect.NewRequest(&v1.WatchTicketRequest{TicketId: ticketID}))
			if err != nil {
				t.Fatalf("WatchTicket = %v", err)
			}
			var states []v1.TicketState
			var last *v1.Ticket
			for stream.Receive() {
				last = stream.Msg().GetTicket()
				states = append(states, last.GetState())
				if len(states) == 1 {
					if _, err := service.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: first.GetToken().GetTokenId()})); err != nil {
						t.Fatalf("the service's Release of alice's token = %v", err)
					}
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("WatchTicket ended with %v after %v", err, states)
			}
			if len(states) < 2 || states[0] != v1.TicketState_TICKET_STATE_WAITING || last.GetState() != v1.TicketState_TICKET_STATE_ADMITTED ||
				last.GetToken().GetTokenId() == "" {
				t.Fatalf("WatchTicket streamed %v (last %v), want WAITING then ADMITTED with a token", states, last)
			}
			if _, err := service.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: last.GetToken().GetTokenId()})); err != nil {
				t.Fatalf("the service's Commit of bob's token = %v", err)
			}
			st, err := service.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
			if err != nil {
				t.Fatal(err)
			}
			if s := st.Msg.GetStock(); s.GetSold() != 1 || s.GetAvailable() != 0 || s.GetTokensOutstanding() != 0 || s.GetWaitlistLength() != 0 {
				t.Errorf("GetStock = %v, want 1 sold, none available, no token outstanding, none waiting", s)
			}
			_, err = request(dave, "dave-1", "")
			expectReason(t, "dave's RequestToken once sold out for good", err, stock.CodeOutOfStock)
			kinds := map[string]int{}
			for _, e := range ledgerOf(t, admin, sku) {
				kinds[e.GetKind()]++
			}
			if kinds["reserve"] != 2 || kinds["release"] != 1 || kinds["commit"] != 1 {
				t.Errorf("ledger entries by kind: %v, want 2 reserves (the tokens), 1 release, 1 commit", kinds)
			}
		})
	}

	// A token left unbought lapses with its TTL; /metrics counts it
	// expired, and each protocol's bought token redeemed (a replayed
	// Commit counts nothing).
	lapse := tokenSKU("lapse", 1)
	lapse.Admission.TokenTtl = durationpb.New(time.Second)
	if _, err := admin.CreateSku(ctx, connect.NewRequest(lapse)); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	eve := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(iss.Sign(t, auth.RolePublic, "eve")))
	if _, err := eve.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: "lapse", Quantity: 1, IdempotencyKey: "eve-1"})); err != nil {
		t.Fatalf("eve's RequestToken = %v", err)
	}
	redeemed, expired := "shardstock_admission_tokens_redeemed_total", "shardstock_admission_tokens_expired_total"
	deadline := time.Now().Add(admitWithin)
	for {
		got := readMetrics(t, admin, redeemed, expired)
		if got[redeemed] == float64(len(protocols)) && got[expired] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics after %s: %v, want %d redeemed and 1 expired", admitWithin, got, len(protocols))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st, err := eve.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "lapse"})); err != nil ||
		st.Msg.GetStock().GetAvailable() != 1 || st.Msg.GetStock().GetTokensOutstanding() != 0 {
		t.Errorf("GetStock after the token lapsed = %v, %v, want the unit available again and no token outstanding", st, err)
	}

	// Without tokens_per_customer a token is granted directly, with no
	// ticket: GetTicket by key reads it from its reservation (its
	// customer's only), and /metrics counts it.
	direct := tokenSKU("direct", 1)
	direct.Admission.TokensPerCustomer = 0
	if _, err := admin.CreateSku(ctx, connect.NewRequest(direct)); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	tok, err := eve.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: "direct", Quantity: 1, IdempotencyKey: "eve-d"}))
	if err != nil || tok.Msg.GetToken().GetTokenId() == "" || tok.Msg.GetTicket() != nil {
		t.Fatalf("eve's RequestToken of a SKU without tokens_per_customer = %v, %v; want a token and no ticket", tok, err)
	}
	got, err := eve.GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{Sku: "direct", IdempotencyKey: "eve-d"}))
	if tk := got.Msg.GetTicket(); err != nil || tk.GetState() != v1.TicketState_TICKET_STATE_ADMITTED || tk.GetTicketId() != "" ||
		tk.GetToken().GetTokenId() != tok.Msg.GetToken().GetTokenId() {
		t.Errorf("eve's GetTicket of her direct token's key = %v, %v; want ADMITTED with token %s and no ticket id", got, err, tok.Msg.GetToken().GetTokenId())
	}
	_, err = shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(alice)).GetTicket(ctx,
		connect.NewRequest(&v1.GetTicketRequest{Sku: "direct", IdempotencyKey: "eve-d"}))
	expectReason(t, "alice's GetTicket of eve's direct token's key", err, stock.CodeTicketNotFound)
	if got := readMetrics(t, admin, "shardstock_admission_tokens_direct_total"); got["shardstock_admission_tokens_direct_total"] != 1 {
		t.Errorf("/metrics: %v, want 1 token granted directly", got)
	}
}

// readMetrics reads the allocator's samples of the families named, by
// name (families without labels).
func readMetrics(t *testing.T, admin shardstockv1connect.AdminServiceClient, names ...string) map[string]float64 {
	t.Helper()
	resp, err := admin.ReadMetrics(context.Background(), connect.NewRequest(&v1.ReadMetricsRequest{Names: names}))
	if err != nil {
		t.Fatalf("ReadMetrics = %v", err)
	}
	out := map[string]float64{}
	for _, s := range resp.Msg.GetSamples() {
		out[s.GetName()] = s.GetValue()
	}
	return out
}

// TestRun_TokensHostile: every hostile input of the token calls, and every
// admission setting out of bounds on CreateSku and UpdateSku, is refused
// with its documented reason, and changes nothing: the same tickets in the
// database, the same ledger, the same stock and SKU settings.
func TestRun_TokensHostile(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "key-1")
	url := pgtest.NewMigratedDB(t)
	base := startWithJWKSOn(t, url, iss)
	hc := transport.NewClient()
	admin := shardstockv1connect.NewAdminServiceClient(hc, base, bearer(token))
	const gated, plain = "gated", "plain"
	// No limit per customer: a hostile request meets no other refusal
	// that could hide its own.
	gatedSKU := tokenSKU(gated, 5)
	gatedSKU.Admission.TokensPerCustomer = 0
	if _, err := admin.CreateSku(ctx, connect.NewRequest(gatedSKU)); err != nil {
		t.Fatalf("CreateSku(%s) = %v", gated, err)
	}
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: plain, InitialStock: 5, Shards: 1})); err != nil {
		t.Fatalf("CreateSku(%s) = %v", plain, err)
	}
	alice := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(iss.Sign(t, auth.RolePublic, "alice")))
	held, err := alice.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: gated, Quantity: 1, IdempotencyKey: "held"}))
	if err != nil || held.Msg.GetToken() == nil {
		t.Fatalf("RequestToken = %v, %v, want a token", held, err)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	type state struct {
		tickets, entries int
		stock            *v1.Stock
		config           *v1.SkuConfig
	}
	snapshot := func() state {
		t.Helper()
		var s state
		if err := db.QueryRow(ctx, "SELECT count(*) FROM admission_tickets").Scan(&s.tickets); err != nil {
			t.Fatal(err)
		}
		s.entries = len(ledgerOf(t, admin, gated)) + len(ledgerOf(t, admin, plain))
		st, err := alice.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: gated}))
		if err != nil {
			t.Fatal(err)
		}
		s.stock = st.Msg.GetStock()
		skus, err := admin.ListSkus(ctx, connect.NewRequest(&v1.ListSkusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(skus.Msg.GetSkus()); n != 2 {
			t.Errorf("ListSkus: %d SKUs, want 2 (%v)", n, skus.Msg.GetSkus())
		}
		for _, sum := range skus.Msg.GetSkus() {
			if sum.GetSku().GetSku() == gated {
				s.config = sum.GetSku()
			}
		}
		return s
	}
	before := snapshot()

	tokenReq := func(sku string, quantity int64, key string) func() error {
		return func() error {
			_, err := alice.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: sku, Quantity: quantity, IdempotencyKey: key}))
			return err
		}
	}
	getTicket := func(m *v1.GetTicketRequest) func() error {
		return func() error { _, err := alice.GetTicket(ctx, connect.NewRequest(m)); return err }
	}
	cancelTicket := func(id string) func() error {
		return func() error {
			_, err := alice.CancelTicket(ctx, connect.NewRequest(&v1.CancelTicketRequest{TicketId: id}))
			return err
		}
	}
	watchTicket := func(id string) func() error {
		return func() error {
			s, err := alice.WatchTicket(ctx, connect.NewRequest(&v1.WatchTicketRequest{TicketId: id}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		}
	}
	badAdmissions := map[string]*v1.Admission{
		"TokenTtlShort":       {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, TokenTtl: durationpb.New(time.Millisecond)},
		"TokenTtlLong":        {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, TokenTtl: durationpb.New(25 * time.Hour)},
		"TokenTtlNegative":    {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, TokenTtl: durationpb.New(-time.Second)},
		"WaitlistNegative":    {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, WaitlistMax: -1},
		"WaitlistHuge":        {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, WaitlistMax: stock.WaitlistMaxMax + 1},
		"PerCustomerNegative": {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, TokensPerCustomer: -1},
		"PerCustomerHuge":     {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, TokensPerCustomer: stock.TokensPerCustomerMax + 1},
		"ModeUnknown":         {Mode: v1.AdmissionMode(99)},
		"DrawWithoutDrawAt":   {Mode: v1.AdmissionMode_ADMISSION_MODE_DRAW},
		"DrawAtWithTokens":    {Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, DrawAt: timestamppb.New(time.Now().Add(time.Hour))},
	}
	cases := map[string]struct {
		call func() error
		want stock.Code
	}{
		"QuantityZero":        {tokenReq(gated, 0, "q0"), stock.CodeInvalidQuantity},
		"QuantityNegative":    {tokenReq(gated, -1, "q-1"), stock.CodeInvalidQuantity},
		"QuantityHuge":        {tokenReq(gated, math.MaxInt64, "qmax"), stock.CodeInvalidQuantity},
		"QuantityAboveMax":    {tokenReq(gated, stock.QuantityMax+1, "qmax1"), stock.CodeInvalidQuantity},
		"KeyEmpty":            {tokenReq(gated, 1, ""), stock.CodeInvalidIdempotencyKey},
		"KeyTooLong":          {tokenReq(gated, 1, strings.Repeat("k", stock.IdempotencyKeyLenMax+1)), stock.CodeInvalidIdempotencyKey},
		"KeyWithSpace":        {tokenReq(gated, 1, "a key"), stock.CodeInvalidIdempotencyKey},
		"SKUEmpty":            {tokenReq("", 1, "k"), stock.CodeInvalidSKU},
		"SKUGarbage":          {tokenReq("no/such sku", 1, "k"), stock.CodeInvalidSKU},
		"SKUUnknown":          {tokenReq("no-such-sku", 1, "k"), stock.CodeSKUNotFound},
		"SKUWithoutAdmission": {tokenReq(plain, 1, "k"), stock.CodeInvalidArgument},
		"GetTicketEmpty":      {getTicket(&v1.GetTicketRequest{}), stock.CodeInvalidSKU},
		"GetTicketUnknown":    {getTicket(&v1.GetTicketRequest{TicketId: "tkt_00000000000000000000000000000000"}), stock.CodeTicketNotFound},
		"GetTicketGarbage":    {getTicket(&v1.GetTicketRequest{TicketId: "tkt_\x00\x01"}), stock.CodeInvalidArgument},
		"GetTicketTooLong":    {getTicket(&v1.GetTicketRequest{TicketId: strings.Repeat("t", 1000)}), stock.CodeInvalidArgument},
		"GetTicketKeyUnknown": {getTicket(&v1.GetTicketRequest{Sku: gated, IdempotencyKey: "never-used"}), stock.CodeTicketNotFound},
		"CancelEmpty":         {cancelTicket(""), stock.CodeInvalidArgument},
		"CancelUnknown":       {cancelTicket("tkt_00000000000000000000000000000000"), stock.CodeTicketNotFound},
		"CancelGarbage":       {cancelTicket("tkt_\x1b[2J"), stock.CodeInvalidArgument},
		"WatchEmpty":          {watchTicket(""), stock.CodeInvalidArgument},
		"WatchUnknown":        {watchTicket("tkt_00000000000000000000000000000000"), stock.CodeTicketNotFound},
		"WatchTooLong":        {watchTicket(strings.Repeat("t", 1000)), stock.CodeInvalidArgument},
	}
	for name, a := range badAdmissions {
		cases["CreateSku"+name] = struct {
			call func() error
			want stock.Code
		}{func() error {
			_, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "bad-" + strings.ToLower(name), InitialStock: 5, Shards: 1, Admission: a}))
			return err
		}, stock.CodeInvalidArgument}
		cases["UpdateSku"+name] = struct {
			call func() error
			want stock.Code
		}{func() error {
			_, err := admin.UpdateSku(ctx, connect.NewRequest(&v1.UpdateSkuRequest{Sku: gated, Admission: a}))
			return err
		}, stock.CodeInvalidArgument}
	}
	for name, c := range cases {
		err := c.call()
		if wire.Reason(err) != string(c.want) || connect.CodeOf(err) == connect.CodeUnknown {
			t.Errorf("%s = %v (reason %q), want %s", name, err, wire.Reason(err), c.want)
		}
	}
	after := snapshot()
	if after.tickets != before.tickets || after.entries != before.entries || !proto.Equal(after.stock, before.stock) || !proto.Equal(after.config, before.config) {
		t.Fatalf("after the refused calls: %d tickets, %d ledger entries, stock %v, config %v; want %d, %d, %v, %v: a refusal must change nothing",
			after.tickets, after.entries, after.stock, after.config, before.tickets, before.entries, before.stock, before.config)
	}
}
