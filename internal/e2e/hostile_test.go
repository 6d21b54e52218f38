package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// hostileCase is one malformed or hostile request, sent as raw HTTP to the
// allocator's public port, and what it must get back: an HTTP status and,
// for a Connect error, its code and reason ("" where Connect itself refuses
// the request before any handler: it carries no shardstock reason).
type hostileCase struct {
	name    string
	path    string // procedure, e.g. "InventoryService/Deduct", or a raw path
	ctype   string // "" = application/json
	header  map[string]string
	body    []byte
	admin   bool // send the admin token
	status  int
	code    string // Connect error code, "" for a non-Connect answer
	reason  string
	method  string // "" = POST
	skipErr bool   // the answer is not a Connect error (e.g. 415, 405)
}

// sharedHostileInput (TestE2E_Shared/HostileInput) sends more than 40
// malformed or hostile requests through the public and admin APIs as raw
// HTTP: wrong types and encodings, sizes past every bound, overflowing and
// negative quantities, control characters and invalid UTF-8, forged or
// foreign reservation ids, bad and missing tokens, bad deadlines. Each gets
// its documented code and reason, and none changes anything: every SKU's
// stock and ledger, and the placement, are as before.
func sharedHostileInput(t *testing.T, s *stack) {
	ctx := context.Background()
	s.createSKU("hostile", 100, 4, func(r *v1.CreateSkuRequest) { r.MaxPerOrder = 10 })
	s.createSKU("victim", 100, 2)
	res, err := s.inv.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: "victim", Quantity: 1, IdempotencyKey: "victim-hold"}))
	if err != nil {
		t.Fatal(err)
	}
	victimID := res.Msg.Reservation.ReservationId
	// The victim's reservation id with the SKU part swapped for another
	// SKU's: a client must not reach another SKU's holds by editing a token.
	parts := strings.SplitN(victimID, ".", 4)
	foreignID := strings.Join([]string{parts[0], base64.RawURLEncoding.EncodeToString([]byte("hostile")), parts[2], parts[3]}, ".")

	// A SKU under admission: its one unit in a token, one ticket waiting,
	// and so its waitlist full (waitlistMax 1).
	s.createSKU("hostile-tok", 1, 1, func(r *v1.CreateSkuRequest) {
		r.Admission = &v1.Admission{Mode: v1.AdmissionMode_ADMISSION_MODE_TOKENS, WaitlistMax: 1, TokensPerCustomer: 1}
	})
	for _, k := range []string{"tok-hold", "tok-wait"} {
		if _, err := s.inv.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: "hostile-tok", Quantity: 1, IdempotencyKey: k, CustomerRef: k})); err != nil {
			t.Fatalf("RequestToken(%s) = %v", k, err)
		}
	}
	waitingTicket, err := s.inv.GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{Sku: "hostile-tok", IdempotencyKey: "tok-wait"}))
	if err != nil || waitingTicket.Msg.Ticket.GetState() != v1.TicketState_TICKET_STATE_WAITING {
		t.Fatalf("GetTicket(tok-wait) = %v, %v; want WAITING", waitingTicket, err)
	}
	waitingID := waitingTicket.Msg.Ticket.GetTicketId()
	tickets := func() string {
		st := s.stock("hostile-tok")
		tk, err := s.inv.GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{TicketId: waitingID}))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("tokens %d waiting %d; %s %s", st.GetTokensOutstanding(), st.GetWaitlistLength(), tk.Msg.Ticket.GetState(), tk.Msg.Ticket.GetTicketId())
	}
	ticketsBefore := tickets()

	before := snapshotBooks(t, s, "hostile", "victim", "hostile-tok")

	j := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	deduct := func(fields string) []byte { return []byte(`{` + fields + `}`) }
	tok := func(fields string) []byte {
		if fields == "" {
			return []byte(`{"sku":"hostile-tok"}`)
		}
		return []byte(`{"sku":"hostile-tok",` + fields + `}`)
	}
	var lines51 []any
	for i := range 51 {
		lines51 = append(lines51, map[string]any{"sku": fmt.Sprintf("s-%d", i), "quantity": "1"})
	}
	ok := `"sku":"hostile","quantity":"1","idempotencyKey":"k-ok"`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"sku":"hostile","quantity":"1","idempotencyKey":"` + strings.Repeat("a", 128<<10) + `"}`))
	zw.Close()
	// A binary protobuf Deduct whose sku field holds invalid UTF-8.
	badUTF8 := protowire.AppendTag(nil, 1, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, []byte{'s', 0xff, 0xfe})
	goodProto, _ := proto.Marshal(&v1.DeductRequest{Sku: "hostile", Quantity: 1, IdempotencyKey: "k-proto"})

	// alg "none", claiming the admin role: no JWKS is configured, and none
	// would take it.
	unsignedJWT := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"mallory","role":"admin"}`)) + "."
	const (
		inv      = "InventoryService/"
		adm      = "AdminService/"
		badArg   = "invalid_argument"
		notFound = "not_found"
	)
	cases := []hostileCase{
		// Encodings and framing: refused by Connect before any handler.
		{name: "not JSON", path: inv + "Deduct", body: []byte(`{{{`), status: 400, code: badArg},
		{name: "JSON array", path: inv + "Deduct", body: []byte(`[1,2]`), status: 400, code: badArg},
		{name: "quantity as text", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"abc","idempotencyKey":"k"`), status: 400, code: badArg},
		{name: "quantity as object", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":{},"idempotencyKey":"k"`), status: 400, code: badArg},
		{name: "quantity past int64", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"9223372036854775808","idempotencyKey":"k"`), status: 400, code: badArg},
		{name: "quantity 1e400", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":1e400,"idempotencyKey":"k"`), status: 400, code: badArg},
		{name: "sku as number", path: inv + "Deduct", body: deduct(`"sku":42,"quantity":"1","idempotencyKey":"k"`), status: 400, code: badArg},
		{name: "enum as a fraction", path: adm + "ListTransfers", admin: true, body: []byte(`{"state":1.5}`), status: 400, code: badArg},
		{name: "duplicate field", path: inv + "Deduct", body: deduct(ok + `,"quantity":"2"`), status: 400, code: badArg},
		{name: "invalid UTF-8 in JSON", path: inv + "Deduct", body: []byte("{\"sku\":\"s\xff\",\"quantity\":\"1\",\"idempotencyKey\":\"k\"}"), status: 400, code: badArg},
		{name: "invalid UTF-8 in protobuf", path: inv + "Deduct", ctype: "application/proto", body: badUTF8, status: 400, code: badArg},
		{name: "protobuf sent as JSON", path: inv + "Deduct", body: goodProto, status: 400, code: badArg},
		{name: "garbage protobuf", path: inv + "Deduct", ctype: "application/proto", body: []byte{0xff, 0xff, 0xff, 0xff}, status: 400, code: badArg},
		{name: "body past 64 KiB", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"1","idempotencyKey":"` + strings.Repeat("a", 70<<10) + `"`), status: 429, code: "resource_exhausted"},
		{name: "gzip bomb past 64 KiB", path: inv + "Deduct", header: map[string]string{"Content-Encoding": "gzip"}, body: gz.Bytes(), status: 429, code: "resource_exhausted"},
		{name: "unknown compression", path: inv + "Deduct", header: map[string]string{"Content-Encoding": "br"}, body: deduct(ok), status: 501, code: "unimplemented"},
		{name: "text/plain", path: inv + "Deduct", ctype: "text/plain", body: deduct(ok), status: 415, skipErr: true},
		{name: "GET of a write", path: inv + "Deduct", method: http.MethodGet, body: nil, status: 405, skipErr: true},
		{name: "unknown procedure", path: inv + "StealStock", body: deduct(ok), status: 404, skipErr: true},
		{name: "bad timeout header", path: inv + "Deduct", header: map[string]string{"Connect-Timeout-Ms": "soon"}, body: deduct(ok), status: 400, code: badArg},
		{name: "expired deadline", path: inv + "Deduct", header: map[string]string{"Connect-Timeout-Ms": "-5"}, body: deduct(ok), status: 504, code: "deadline_exceeded"},
		{name: "deadline of zero", path: inv + "Deduct", header: map[string]string{"Connect-Timeout-Ms": "0"}, body: deduct(ok), status: 504, code: "deadline_exceeded"},
		{name: "header past 64 KiB", path: inv + "Deduct", header: map[string]string{"X-Padding": strings.Repeat("p", 80<<10)}, body: deduct(ok), status: 431, skipErr: true},

		// Fields the domain refuses, each with its reason.
		{name: "empty body", path: inv + "Deduct", body: []byte(`{}`), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "sku with NUL", path: inv + "Deduct", body: j(map[string]any{"sku": "host\x00ile", "quantity": "1", "idempotencyKey": "k"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "sku with newline", path: inv + "Deduct", body: j(map[string]any{"sku": "hostile\n", "quantity": "1", "idempotencyKey": "k"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "sku lookalike", path: inv + "Deduct", body: j(map[string]any{"sku": "hostilе", "quantity": "1", "idempotencyKey": "k"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "sku path traversal", path: inv + "Deduct", body: j(map[string]any{"sku": "../hostile", "quantity": "1", "idempotencyKey": "k"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "sku SQL", path: inv + "Deduct", body: j(map[string]any{"sku": "x'; DROP TABLE ledger;--", "quantity": "1", "idempotencyKey": "k"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "sku 65 characters", path: inv + "Deduct", body: j(map[string]any{"sku": strings.Repeat("s", 65), "quantity": "1", "idempotencyKey": "k"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "quantity zero", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"0","idempotencyKey":"k"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "quantity negative", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"-5","idempotencyKey":"k"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "quantity max int64", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"9223372036854775807","idempotencyKey":"k"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "quantity min int64", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"-9223372036854775808","idempotencyKey":"k"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "replenish negative", path: inv + "Replenish", body: deduct(`"sku":"hostile","quantity":"-100","idempotencyKey":"k"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "above max per order", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"11","idempotencyKey":"k"`), status: 400, code: badArg, reason: "QUANTITY_ABOVE_MAX_PER_ORDER"},
		{name: "key missing", path: inv + "Deduct", body: deduct(`"sku":"hostile","quantity":"1"`), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "key with bell", path: inv + "Deduct", body: j(map[string]any{"sku": "hostile", "quantity": "1", "idempotencyKey": "k\a"}), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "key 129 characters", path: inv + "Deduct", body: j(map[string]any{"sku": "hostile", "quantity": "1", "idempotencyKey": strings.Repeat("k", 129)}), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "order ref with escape", path: inv + "Deduct", body: j(map[string]any{"sku": "hostile", "quantity": "1", "idempotencyKey": "k", "orderRef": "o\x1b[31m"}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "customer ref 129 characters", path: inv + "Deduct", body: j(map[string]any{"sku": "hostile", "quantity": "1", "idempotencyKey": "k", "customerRef": strings.Repeat("c", 129)}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "ttl negative", path: inv + "Reserve", body: deduct(`"sku":"hostile","quantity":"1","idempotencyKey":"k","ttl":"-5s"`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "ttl 100 days", path: inv + "Reserve", body: deduct(`"sku":"hostile","quantity":"1","idempotencyKey":"k","ttl":"8640000s"`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "ttl as text", path: inv + "Reserve", body: deduct(`"sku":"hostile","quantity":"1","idempotencyKey":"k","ttl":"soon"`), status: 400, code: badArg},
		{name: "reservation id empty", path: inv + "Commit", body: []byte(`{"reservationId":""}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "reservation id forged", path: inv + "Commit", body: j(map[string]string{"reservationId": "r1.aG9zdGlsZQ.0.000000000000000000000000"}), status: 404, code: notFound, reason: "RESERVATION_NOT_FOUND"},
		{name: "reservation id of another SKU", path: inv + "Commit", body: j(map[string]string{"reservationId": foreignID}), status: 404, code: notFound, reason: "RESERVATION_NOT_FOUND"},
		{name: "reservation id shard 9999", path: inv + "Release", body: j(map[string]string{"reservationId": parts[0] + "." + parts[1] + ".9999." + parts[3]}), status: 404, code: notFound, reason: "RESERVATION_NOT_FOUND"},
		{name: "reservation id 10 KiB", path: inv + "Release", body: j(map[string]string{"reservationId": strings.Repeat("r", 10<<10)}), status: 404, code: notFound, reason: "RESERVATION_NOT_FOUND"},
		{name: "GetStock no sku", path: inv + "GetStock", body: []byte(`{}`), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "GetOperation no key", path: inv + "GetOperation", body: []byte(`{"sku":"hostile"}`), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "commit quantity negative", path: inv + "Commit", body: j(map[string]any{"reservationId": victimID, "quantity": "-1"}), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "extend without ttl", path: inv + "ExtendReservation", body: j(map[string]any{"reservationId": victimID}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "extend 100 days", path: inv + "ExtendReservation", body: j(map[string]any{"reservationId": victimID, "ttl": "8640000s"}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "extend another SKU's hold", path: inv + "ExtendReservation", body: j(map[string]any{"reservationId": foreignID, "ttl": "60s"}), status: 404, code: notFound, reason: "RESERVATION_NOT_FOUND"},
		{name: "refund without original", path: inv + "Refund", body: deduct(`"sku":"hostile","quantity":"1","idempotencyKey":"rf"`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "refund of another SKU's hold", path: inv + "Refund", body: j(map[string]any{"sku": "hostile", "quantity": "1", "idempotencyKey": "rf", "original": map[string]string{"reservationId": victimID}}), status: 404, code: notFound, reason: "SALE_NOT_FOUND"},
		{name: "refund of no sale", path: inv + "Refund", body: j(map[string]any{"sku": "hostile", "quantity": "1", "idempotencyKey": "rf", "original": map[string]string{"deductKey": "never"}}), status: 404, code: notFound, reason: "SALE_NOT_FOUND"},
		{name: "refund quantity overflow", path: inv + "Refund", body: j(map[string]any{"sku": "hostile", "quantity": "9223372036854775807", "idempotencyKey": "rf", "original": map[string]string{"deductKey": "never"}}), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "order of 51 lines", path: inv + "ReserveOrder", body: j(map[string]any{"idempotencyKey": "o", "lines": lines51}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "order with a SKU twice", path: inv + "ReserveOrder", body: j(map[string]any{"idempotencyKey": "o", "lines": []any{map[string]any{"sku": "hostile", "quantity": "1"}, map[string]any{"sku": "hostile", "quantity": "2"}}}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "order quantities overflowing", path: inv + "ReserveOrder", body: j(map[string]any{"idempotencyKey": "o", "lines": []any{map[string]any{"sku": "hostile", "quantity": "9223372036854775807"}, map[string]any{"sku": "victim", "quantity": "9223372036854775807"}}}), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "order line's key taken", path: inv + "Reserve", body: deduct(`"sku":"hostile","quantity":"1","idempotencyKey":"order-line:x"`), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "get order of nothing", path: inv + "GetOrder", body: []byte(`{}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},

		// Admission: RequestToken, GetTicket, CancelTicket, GetDraw.
		{name: "token quantity zero", path: inv + "RequestToken", body: tok(`"quantity":"0","idempotencyKey":"t","customerRef":"c9"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "token quantity negative", path: inv + "RequestToken", body: tok(`"quantity":"-3","idempotencyKey":"t","customerRef":"c9"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "token quantity max int64", path: inv + "RequestToken", body: tok(`"quantity":"9223372036854775807","idempotencyKey":"t","customerRef":"c9"`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "token key missing", path: inv + "RequestToken", body: tok(`"quantity":"1","customerRef":"c9"`), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "token key 129 characters", path: inv + "RequestToken", body: j(map[string]any{"sku": "hostile-tok", "quantity": "1", "idempotencyKey": strings.Repeat("k", 129), "customerRef": "c9"}), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "token sku 65 characters", path: inv + "RequestToken", body: j(map[string]any{"sku": strings.Repeat("s", 65), "quantity": "1", "idempotencyKey": "t", "customerRef": "c9"}), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "token of an unknown SKU", path: inv + "RequestToken", body: j(map[string]any{"sku": "ghost", "quantity": "1", "idempotencyKey": "t", "customerRef": "c9"}), status: 404, code: notFound, reason: "SKU_NOT_FOUND"},
		{name: "token of a SKU without admission", path: inv + "RequestToken", body: j(map[string]any{"sku": "victim", "quantity": "1", "idempotencyKey": "t", "customerRef": "c9"}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "token customer ref 129 characters", path: inv + "RequestToken", body: j(map[string]any{"sku": "hostile-tok", "quantity": "1", "idempotencyKey": "t", "customerRef": strings.Repeat("c", 129)}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "token without a customer", path: inv + "RequestToken", body: tok(`"quantity":"1","idempotencyKey":"t"`), status: 400, code: badArg, reason: "CUSTOMER_REF_REQUIRED"},
		{name: "token key reused", path: inv + "RequestToken", body: tok(`"quantity":"2","idempotencyKey":"tok-wait","customerRef":"tok-wait"`), status: 400, code: badArg, reason: "IDEMPOTENCY_KEY_REUSED"},
		{name: "token past a full waitlist", path: inv + "RequestToken", body: tok(`"quantity":"1","idempotencyKey":"t-full","customerRef":"c9"`), status: 400, code: "failed_precondition", reason: "WAITLIST_FULL"},
		{name: "token without a credential", path: inv + "RequestToken", header: map[string]string{"Authorization": ""}, body: tok(`"quantity":"1","idempotencyKey":"t","customerRef":"c9"`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "plain reserve under admission", path: inv + "Reserve", body: tok(`"quantity":"1","idempotencyKey":"r-plain"`), status: 400, code: "failed_precondition", reason: "TOKEN_REQUIRED"},
		{name: "ticket of nothing", path: inv + "GetTicket", body: []byte(`{}`), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "ticket id 37 characters", path: inv + "GetTicket", body: j(map[string]string{"ticketId": strings.Repeat("t", 37)}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "ticket id with escape", path: inv + "GetTicket", body: j(map[string]string{"ticketId": "tkt_\x1b[31m"}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "ticket id forged", path: inv + "GetTicket", body: j(map[string]string{"ticketId": "tkt_00000000000000000000000000000000"}), status: 404, code: notFound, reason: "TICKET_NOT_FOUND"},
		{name: "ticket by an unknown key", path: inv + "GetTicket", body: tok(`"idempotencyKey":"never"`), status: 404, code: notFound, reason: "TICKET_NOT_FOUND"},
		{name: "ticket by a key 129 characters", path: inv + "GetTicket", body: j(map[string]string{"sku": "hostile-tok", "idempotencyKey": strings.Repeat("k", 129)}), status: 400, code: badArg, reason: "INVALID_IDEMPOTENCY_KEY"},
		{name: "cancel no ticket", path: inv + "CancelTicket", body: []byte(`{}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "cancel ticket id 10 KiB", path: inv + "CancelTicket", body: j(map[string]string{"ticketId": strings.Repeat("t", 10<<10)}), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "cancel ticket forged", path: inv + "CancelTicket", body: j(map[string]string{"ticketId": "tkt_00000000000000000000000000000000"}), status: 404, code: notFound, reason: "TICKET_NOT_FOUND"},
		{name: "cancel without a credential", path: inv + "CancelTicket", header: map[string]string{"Authorization": ""}, body: j(map[string]string{"ticketId": waitingID}), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "draw of nothing", path: inv + "GetDraw", body: []byte(`{}`), status: 400, code: badArg, reason: "INVALID_SKU"},
		{name: "draw page of 10001", path: inv + "GetDraw", body: tok(`"pageSize":10001`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "draw page size negative", path: inv + "GetDraw", body: tok(`"pageSize":-1`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "draw page token forged", path: inv + "GetDraw", body: tok(`"pageToken":"-3"`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "draw of a SKU not by draw", path: inv + "GetDraw", body: tok(``), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "draw of an unknown SKU", path: inv + "GetDraw", body: []byte(`{"sku":"ghost"}`), status: 404, code: notFound, reason: "SKU_NOT_FOUND"},

		// Credentials: none, a forged or unsigned JWT, or a role's that
		// does not reach the call.
		{name: "replenish without a credential", path: inv + "Replenish", header: map[string]string{"Authorization": ""}, body: deduct(`"sku":"hostile","quantity":"1000000","idempotencyKey":"free"`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "deduct without a credential", path: inv + "Deduct", header: map[string]string{"Authorization": ""}, body: deduct(ok), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "release of another's hold without a credential", path: inv + "Release", header: map[string]string{"Authorization": ""}, body: j(map[string]string{"reservationId": victimID}), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "operation lookup without a credential", path: inv + "GetOperation", header: map[string]string{"Authorization": ""}, body: []byte(`{"sku":"victim","idempotencyKey":"victim-hold"}`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "unsigned JWT", path: inv + "Deduct", header: map[string]string{"Authorization": "Bearer " + unsignedJWT}, body: deduct(ok), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "service token on the admin API", path: adm + "AdjustStock", header: map[string]string{"Authorization": "Bearer " + serviceToken}, body: []byte(`{"sku":"hostile","delta":"1000","reason":"x","approver":"y","idempotencyKey":"a"}`), status: 403, code: "permission_denied", reason: "PERMISSION_DENIED"},

		// The admin API: tokens first, then fields.
		{name: "admin without token", path: adm + "AdjustStock", body: []byte(`{"sku":"hostile","delta":"1000","reason":"x","approver":"y","idempotencyKey":"a"}`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "admin wrong token", path: adm + "AdjustStock", header: map[string]string{"Authorization": "Bearer " + strings.Repeat("x", len(adminToken))}, body: []byte(`{"sku":"hostile","delta":"1000","reason":"x","approver":"y","idempotencyKey":"a"}`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "admin token lower-case scheme", path: adm + "SetShards", header: map[string]string{"Authorization": "bearer " + adminToken}, body: []byte(`{"sku":"hostile","shards":64}`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "admin token with suffix", path: adm + "SetShards", header: map[string]string{"Authorization": "Bearer " + adminToken + "x"}, body: []byte(`{"sku":"hostile","shards":64}`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "admin token prefix", path: adm + "SetShards", header: map[string]string{"Authorization": "Bearer " + adminToken[:len(adminToken)-1]}, body: []byte(`{"sku":"hostile","shards":64}`), status: 401, code: "unauthenticated", reason: "UNAUTHENTICATED"},
		{name: "create sku negative stock", path: adm + "CreateSku", admin: true, body: []byte(`{"sku":"new-1","initialStock":"-1","shards":2}`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "create sku 257 shards", path: adm + "CreateSku", admin: true, body: []byte(`{"sku":"new-2","initialStock":"1","shards":257}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "create sku that exists", path: adm + "CreateSku", admin: true, body: []byte(`{"sku":"hostile","initialStock":"1000000","shards":2}`), status: 409, code: "already_exists", reason: "SKU_ALREADY_EXISTS"},
		{name: "adjust without reason", path: adm + "AdjustStock", admin: true, body: []byte(`{"sku":"hostile","delta":"5","approver":"y","idempotencyKey":"a1"}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "adjust without approver", path: adm + "AdjustStock", admin: true, body: []byte(`{"sku":"hostile","delta":"5","reason":"x","idempotencyKey":"a2"}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "adjust past the stock bound", path: adm + "AdjustStock", admin: true, body: []byte(`{"sku":"hostile","delta":"1000000000001","reason":"x","approver":"y","idempotencyKey":"a3"}`), status: 400, code: badArg, reason: "INVALID_QUANTITY"},
		{name: "set shards 0", path: adm + "SetShards", admin: true, body: []byte(`{"sku":"hostile","shards":0}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "set shards of unknown SKU", path: adm + "SetShards", admin: true, body: []byte(`{"sku":"ghost","shards":4}`), status: 404, code: notFound, reason: "SKU_NOT_FOUND"},
		{name: "update sku negative limit", path: adm + "UpdateSku", admin: true, body: []byte(`{"sku":"hostile","maxPerOrder":"-1"}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "ledger page token forged", path: adm + "ListLedger", admin: true, body: []byte(`{"sku":"hostile","pageToken":"-3"}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "transfers state 99", path: adm + "ListTransfers", admin: true, body: []byte(`{"state":99}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "resume shard -1", path: adm + "ResumeShard", admin: true, body: []byte(`{"sku":"hostile","index":-1,"approver":"y","reason":"x"}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "placement bad name", path: adm + "SetPlacement", admin: true, body: []byte(`{"databases":["Main DB"]}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
		{name: "placement unknown database", path: adm + "SetPlacement", admin: true, body: []byte(`{"databases":["main","elsewhere"]}`), status: 400, code: badArg, reason: "INVALID_ARGUMENT"},
	}
	if len(cases) < 40 {
		t.Fatalf("%d cases, want at least 40", len(cases))
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, code, reason, body := sendRaw(t, client, s.base, tc)
			if status != tc.status {
				t.Errorf("status %d, want %d: %s", status, tc.status, body)
			}
			if tc.skipErr {
				return
			}
			if code != tc.code || reason != tc.reason {
				t.Errorf("code %q reason %q, want %q %q: %s", code, reason, tc.code, tc.reason, body)
			}
			if strings.Contains(strings.ToLower(body), "sql") && !strings.Contains(tc.name, "SQL") {
				t.Errorf("answer leaks SQL: %s", body)
			}
		})
	}
	// WatchTicket, a server stream, over a Connect client: refused the same.
	for _, tc := range []struct {
		id   string
		want connect.Code
	}{{strings.Repeat("t", 37), connect.CodeInvalidArgument}, {"", connect.CodeInvalidArgument}, {"tkt_00000000000000000000000000000000", connect.CodeNotFound}} {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := s.inv.WatchTicket(wctx, connect.NewRequest(&v1.WatchTicketRequest{TicketId: tc.id}))
		if err == nil {
			for st.Receive() {
				t.Errorf("WatchTicket(%.12q) sent %v, want a refusal", tc.id, st.Msg())
			}
			err = st.Err()
			st.Close()
		}
		cancel()
		if connect.CodeOf(err) != tc.want {
			t.Errorf("WatchTicket(%.12q) = %v, want %v", tc.id, err, tc.want)
		}
	}
	if after := snapshotBooks(t, s, "hostile", "victim", "hostile-tok"); after != before {
		t.Errorf("the refused requests changed the books:\nbefore %s\nafter  %s", before, after)
	}
	if after := tickets(); after != ticketsBefore {
		t.Errorf("the refused requests changed the tickets:\nbefore %s\nafter  %s", ticketsBefore, after)
	}
	// The victim's hold is untouched and still theirs to commit.
	if _, err := s.inv.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: victimID})); err != nil {
		t.Errorf("the victim's own Commit = %v", err)
	}
}

// sendRaw sends one hostile request and returns the HTTP status, and for a
// Connect JSON error its code and ErrorInfo reason, and the body.
func sendRaw(t *testing.T, client *http.Client, base string, tc hostileCase) (status int, code, reason, body string) {
	t.Helper()
	method := tc.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, base+"/shardstock.v1."+tc.path, bytes.NewReader(tc.body))
	if err != nil {
		t.Fatal(err)
	}
	ctype := tc.ctype
	if ctype == "" {
		ctype = "application/json"
	}
	req.Header.Set("Content-Type", ctype)
	switch {
	case tc.admin:
		req.Header.Set("Authorization", "Bearer "+adminToken)
	case strings.HasPrefix(tc.path, "InventoryService/"):
		req.Header.Set("Authorization", "Bearer "+serviceToken) // the shop's backend
	}
	for k, v := range tc.header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", tc.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e struct {
		Code    string `json:"code"`
		Details []struct {
			Debug struct {
				Reason string `json:"reason"`
			} `json:"debug"`
		} `json:"details"`
	}
	if json.Unmarshal(b, &e) == nil {
		code = e.Code
		for _, d := range e.Details {
			if d.Debug.Reason != "" {
				reason = d.Debug.Reason
			}
		}
	}
	return resp.StatusCode, code, reason, string(b)
}

// snapshotBooks renders the SKUs' stock, per shard, and their ledgers, and
// the placement: what a refused request must not change.
func snapshotBooks(t *testing.T, s *stack, skus ...string) string {
	t.Helper()
	var b strings.Builder
	for _, sku := range skus {
		st := s.stock(sku)
		fmt.Fprintf(&b, "%s: %d/%d/%d shards %d;", sku, st.Available, st.Reserved, st.Sold, len(st.Shards))
		for _, sh := range st.Shards {
			fmt.Fprintf(&b, " %d:%d/%d/%d", sh.Index, sh.Available, sh.Reserved, sh.Sold)
		}
		fmt.Fprintf(&b, "; ledger %d entries\n", len(s.ledger(sku)))
	}
	topo, err := s.admin.GetTopology(context.Background(), adminReq(&v1.GetTopologyRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "placement v%d", topo.Msg.Placement.GetVersion())
	return b.String()
}
