// Package stockctlcmd is stockctl, the operators' command line: every admin
// RPC, plus stock, operation lookups and a bulk import of SKUs from CSV.
// Tables by default, --json for one protojson object per answer; the exit
// code says the class of an error (exitCodes).
package stockctlcmd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/schollz/progressbar/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/cmd/startup"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// Exit codes by class of error.
const (
	ExitOK          = 0
	ExitOther       = 1 // internal, unknown, a broken answer
	ExitUsage       = 2 // bad flags or arguments: nothing was sent
	ExitRefused     = 3 // the request was refused; nothing changed
	ExitNotFound    = 4
	ExitAuth        = 5
	ExitUnavailable = 6 // retryable: try again, with the same key
)

// exitCodes maps a Connect code to its exit code.
var exitCodes = map[connect.Code]int{
	connect.CodeInvalidArgument:    ExitRefused,
	connect.CodeFailedPrecondition: ExitRefused,
	connect.CodeOutOfRange:         ExitRefused,
	connect.CodeAlreadyExists:      ExitRefused,
	connect.CodeNotFound:           ExitNotFound,
	connect.CodeUnauthenticated:    ExitAuth,
	connect.CodePermissionDenied:   ExitAuth,
	connect.CodeUnavailable:        ExitUnavailable,
	connect.CodeDeadlineExceeded:   ExitUnavailable,
	connect.CodeResourceExhausted:  ExitUnavailable,
	connect.CodeAborted:            ExitUnavailable,
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

const usage = `stockctl: steer shardstock through its admin API.

usage: stockctl [global flags] <command> [flags] [args]

global flags (before the command):
  -url URL          the allocators' address (env SHARDSTOCK_URL; default http://127.0.0.1:8080)
  -admin-token T    the admin token (env SHARDSTOCK_ADMIN_TOKEN); never printed
  -timeout D        per call (default 10s)
  -json             print each answer as protojson, one object a line
  -protocol P       connect, grpc or grpcweb (default connect)
  -ca FILE          trust this PEM CA for an https:// -url, instead of the system's (env SHARDSTOCK_CA)

commands:
  stock SKU                              a SKU's stock, per shard
  operation SKU KEY                      the first answer to an idempotency key
  order ORDER_ID | order -key KEY        an order (docs/orders.md): its state and lines
  create-sku SKU -stock N [-shards N -max-per-order N -customer-limit N -ttl D]
                 [-admission tokens|draw -token-ttl D -waitlist-max N -tokens-per-customer N -draw-at T]
  request-token SKU -key K [-quantity N -customer C]
                                         a purchase token, or a ticket in the waitlist (docs/admission.md)
  ticket TICKET_ID | ticket -sku SKU -key KEY
                                         a ticket: WAITING and its position, ADMITTED and its token, ...
  cancel-ticket TICKET_ID                take a ticket out of the waitlist (or its draw)
  watch-ticket TICKET_ID                 a ticket, then each change of it, until its outcome
  draw SKU [-page-token T -page-size N]  a draw: its state, seed and tickets in drawn order (docs/admission.md)
  update-sku SKU [-paused=true|false -max-per-order N -customer-limit N -auto-shards=true|false
                 -sale-start T -sale-end T -clear-sale-window]
                                         T: RFC 3339 (2026-12-24T18:00:00Z) or +DURATION from now
  skus [-prefix P] [-status active|paused] [-all] [-page-size N] [-page-token T]
                                         every SKU of every database, by name, with its counts
  prewarm SKU [SKU...]                   start every shard writer, load rows and hints, open connections
  pause SKU / resume SKU                 update-sku -paused=true / false
  adjust-stock SKU -delta N -reason R -approver A [-key K]
  set-shards SKU N
  rebalance SKU [-dry-run] [-wait]       -wait: a progress bar until its transfers end
  transfers [-sku SKU] [-state S] [-all] [-page-size N] [-page-token T]
  topology                               servers, partitions, move leases, placement
  ledger SKU [-all] [-page-size N] [-page-token T]
  watch ledger [-cursor C] [-sku SKU]... [-consumer NAME]
                                         every ledger entry after C, as it commits, with the cursor after it,
                                         until interrupted; on an error, the last cursor to resume from
  watch stock SKU [SKU...]               the SKUs' stock as it changes (SOLD_OUT, BACK_IN_STOCK)
  reconcile SKU
  resume-shard SKU INDEX -approver A -reason R
  set-placement DB [DB...]               new SKUs spread over these databases
  bump-etcd-revision PAST [-etcd-endpoints E -etcd-ca F -etcd-cert F -etcd-key F]
                                         writes etcd (not the admin API) until its revision is at least
                                         PAST, the number a process not ready because etcd is behind names
  import FILE.csv [-progress] [-stop-on-error]
                                         columns: sku,stock[,shards,max_per_order,customer_limit]; a header
                                         line is skipped; SKUs that exist are counted as skipped

exit codes: 0 ok; 1 other error; 2 usage; 3 refused (invalid_argument, failed_precondition,
out_of_range, already_exists: nothing changed); 4 not found; 5 unauthenticated or permission
denied; 6 unavailable, deadline exceeded, resource exhausted or aborted (retry).
`

// Run runs stockctl with args (without the program name) and returns its
// exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	err := run(ctx, args, getenv, stdout, stderr)
	if err == nil {
		return ExitOK
	}
	var ue usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "stockctl: %s\n(stockctl help lists the commands)\n", ue.msg)
		return ExitUsage
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		fmt.Fprintf(stderr, "stockctl: %s: %s: %s\n", ce.Code(), reasonOf(ce), ce.Message())
		if code, ok := exitCodes[ce.Code()]; ok {
			return code
		}
		return ExitOther
	}
	fmt.Fprintf(stderr, "stockctl: %v\n", err)
	return ExitOther
}

// reasonOf is the ErrorInfo reason of err, or "-".
func reasonOf(err *connect.Error) string {
	for _, d := range err.Details() {
		if v, e := d.Value(); e == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.Reason
			}
		}
	}
	return "-"
}

// cli is one invocation: its clients and how it prints.
type cli struct {
	admin   shardstockv1connect.AdminServiceClient
	inv     shardstockv1connect.InventoryServiceClient
	token   string
	timeout time.Duration
	json    bool
	out     io.Writer
	errw    io.Writer
	getenv  func(string) string
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", envOr(getenv, "SHARDSTOCK_URL", "http://127.0.0.1:8080"), "")
	token := fs.String("admin-token", getenv("SHARDSTOCK_ADMIN_TOKEN"), "")
	timeout := fs.Duration("timeout", 10*time.Second, "")
	asJSON := fs.Bool("json", false, "")
	protocol := fs.String("protocol", "connect", "")
	caFile := fs.String("ca", getenv("SHARDSTOCK_CA"), "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	rest := fs.Args()
	if len(rest) == 0 || rest[0] == "help" {
		return flag.ErrHelp
	}
	var opts []connect.ClientOption
	switch *protocol {
	case "connect":
	case "grpc":
		opts = append(opts, connect.WithGRPC())
	case "grpcweb":
		opts = append(opts, connect.WithGRPCWeb())
	default:
		return usagef("-protocol %q: want connect, grpc or grpcweb", *protocol)
	}
	base := strings.TrimRight(*url, "/")
	hc, err := httpClient(*protocol, base, *caFile)
	if err != nil {
		return err
	}
	c := &cli{
		admin:   shardstockv1connect.NewAdminServiceClient(hc, base, opts...),
		inv:     shardstockv1connect.NewInventoryServiceClient(hc, base, opts...),
		token:   *token,
		timeout: *timeout,
		json:    *asJSON,
		out:     stdout,
		errw:    stderr,
		getenv:  getenv,
	}
	cmd, ok := commands[rest[0]]
	if !ok {
		return usagef("unknown command %q", rest[0])
	}
	return cmd(ctx, c, rest[1:])
}

// httpClient returns the HTTP client for protocol at base: for http://,
// cleartext HTTP/2 with prior knowledge for gRPC and HTTP/1.1 or h2c as the
// server offers for the others; for https://, TLS that trusts caFile (the
// system's CAs without one), HTTP/2 by ALPN (and HTTP/1.1 but for gRPC).
func httpClient(protocol, base, caFile string) (*http.Client, error) {
	if !strings.HasPrefix(base, "https://") {
		if caFile != "" {
			return nil, usagef("-ca needs an https:// -url")
		}
		if protocol == "grpc" {
			return transport.NewClient(), nil
		}
		return http.DefaultClient, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, usagef("-ca: %v", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, usagef("-ca %s: no PEM certificate in it", caFile)
		}
	}
	var p http.Protocols
	p.SetHTTP2(true)
	if protocol != "grpc" {
		p.SetHTTP1(true)
	}
	return &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: cfg}}, nil
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// commands are stockctl's commands by name.
var commands map[string]func(ctx context.Context, c *cli, args []string) error

func init() {
	commands = map[string]func(ctx context.Context, c *cli, args []string) error{
		"stock":              cmdStock,
		"operation":          cmdOperation,
		"order":              cmdOrder,
		"create-sku":         cmdCreateSKU,
		"update-sku":         cmdUpdateSKU,
		"pause":              func(ctx context.Context, c *cli, a []string) error { return cmdPause(ctx, c, a, true) },
		"resume":             func(ctx context.Context, c *cli, a []string) error { return cmdPause(ctx, c, a, false) },
		"adjust-stock":       cmdAdjust,
		"set-shards":         cmdSetShards,
		"rebalance":          cmdRebalance,
		"transfers":          cmdTransfers,
		"topology":           cmdTopology,
		"ledger":             cmdLedger,
		"watch":              cmdWatch,
		"reconcile":          cmdReconcile,
		"resume-shard":       cmdResumeShard,
		"set-placement":      cmdSetPlacement,
		"import":             cmdImport,
		"bump-etcd-revision": cmdBumpEtcdRevision,
		"skus":               cmdSKUs,
		"prewarm":            cmdPrewarm,
		"request-token":      cmdRequestToken,
		"ticket":             cmdTicket,
		"cancel-ticket":      cmdCancelTicket,
		"watch-ticket":       cmdWatchTicket,
		"draw":               cmdDraw,
	}
}

// req wraps msg with the admin token.
func req[T any](c *cli, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if c.token != "" {
		r.Header().Set("Authorization", "Bearer "+c.token)
	}
	return r
}

// call runs f with the per-call timeout.
func call[T any](ctx context.Context, c *cli, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return f(ctx)
}

// parse parses a command's flags, interleaved with its positional
// arguments, and checks that there are want of those (-1: any number).
func parse(fs *flag.FlagSet, args []string, want int, names string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if want >= 0 && len(pos) != want {
		return nil, usagef("%s: want %s", fs.Name(), names)
	}
	return pos, nil
}

// show prints msg as JSON, or calls table.
func (c *cli) show(msg proto.Message, table func(w *tabwriter.Writer)) error {
	if c.json {
		b, err := protojson.MarshalOptions{UseProtoNames: false}.Marshal(msg)
		if err != nil {
			return err
		}
		fmt.Fprintln(c.out, string(b))
		return nil
	}
	w := tabwriter.NewWriter(c.out, 2, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func stockTable(w *tabwriter.Writer, st *v1.Stock) {
	fmt.Fprintf(w, "SKU\tSTATUS\tAVAILABLE\tRESERVED\tSOLD\tIN TRANSIT\tSHARDS IN SERVICE\n")
	fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", st.GetSku(), strings.TrimPrefix(st.GetStatus().String(), "SKU_STATUS_"),
		st.GetAvailable(), st.GetReserved(), st.GetSold(), st.GetInTransit(), st.GetShardsInService())
	if st.GetTokensOutstanding() != 0 || st.GetWaitlistLength() != 0 {
		fmt.Fprintf(w, "\nTOKENS OUTSTANDING\tWAITLIST\n%d\t%d\n", st.GetTokensOutstanding(), st.GetWaitlistLength())
	}
	fmt.Fprintf(w, "\nSHARD\tSTATE\tSERVER\tAVAILABLE\tRESERVED\tSOLD\tHALTED\n")
	for _, sh := range st.GetShards() {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%d\t%s\n", sh.GetIndex(), strings.TrimPrefix(sh.GetState().String(), "SHARD_STATE_"),
			dash(sh.GetServerId()), sh.GetAvailable(), sh.GetReserved(), sh.GetSold(), dash(sh.GetHaltedReason()))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cmdStock(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("stock", flag.ContinueOnError), args, 1, "SKU")
	if err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetStockResponse], error) {
		return c.inv.GetStock(ctx, req(c, &v1.GetStockRequest{Sku: pos[0]}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		stockTable(w, resp.Msg.GetStock())
		if d := resp.Msg.GetDraw(); d != nil {
			drawSummaryTable(w, d)
		}
	})
}

// drawSummaryTable prints a draw's state under a SKU's stock.
func drawSummaryTable(w *tabwriter.Writer, d *v1.DrawSummary) {
	drawnAt := "-"
	if d.GetDrawnAt() != nil {
		drawnAt = d.GetDrawnAt().AsTime().Format(time.RFC3339)
	}
	seed := "no"
	if d.GetSeedRecorded() {
		seed = "yes"
	}
	fmt.Fprintf(w, "\nDRAW\tDRAW AT\tDRAWN AT\tTICKETS\tWINNERS\tSEED RECORDED\n%s\t%s\t%s\t%d\t%d\t%s\n",
		strings.TrimPrefix(d.GetState().String(), "DRAW_STATE_"), d.GetDrawAt().AsTime().Format(time.RFC3339), drawnAt,
		d.GetTickets(), d.GetWinners(), seed)
}

func cmdOperation(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("operation", flag.ContinueOnError), args, 2, "SKU KEY")
	if err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetOperationResponse], error) {
		return c.inv.GetOperation(ctx, req(c, &v1.GetOperationRequest{Sku: pos[0], IdempotencyKey: pos[1]}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		op := resp.Msg.GetOperation()
		fmt.Fprintf(w, "SKU\tKEY\tKIND\tQUANTITY\tSHARD\tRESERVATION\tSTATE\tORDER\tORIGINAL\tCREATED\n")
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", op.GetSku(), op.GetIdempotencyKey(), strings.TrimPrefix(op.GetKind().String(), "OPERATION_KIND_"),
			op.GetQuantity(), op.GetShard(), dash(op.GetReservationId()), strings.TrimPrefix(op.GetReservationState().String(), "RESERVATION_STATE_"),
			dash(op.GetOrderId()), dash(wire.SaleFromProto(op.GetOriginal()).ID()), op.GetCreatedAt().AsTime().Format(time.RFC3339))
	})
}

func cmdOrder(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("order", flag.ContinueOnError)
	key := fs.String("key", "", "")
	pos, err := parse(fs, args, -1, "")
	if err != nil {
		return err
	}
	if (len(pos) == 1) == (*key != "") || len(pos) > 1 {
		return usagef("order: want ORDER_ID, or -key KEY")
	}
	m := &v1.GetOrderRequest{IdempotencyKey: *key}
	if len(pos) == 1 {
		m.OrderId = pos[0]
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetOrderResponse], error) {
		return c.inv.GetOrder(ctx, req(c, m))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		o := resp.Msg.GetOrder()
		fmt.Fprintf(w, "ORDER\tKEY\tSTATE\tREASON\n%s\t%s\t%s\t%s\n", o.GetOrderId(), o.GetIdempotencyKey(),
			strings.TrimPrefix(o.GetState().String(), "ORDER_STATE_"), dash(o.GetReason()))
		fmt.Fprintf(w, "SKU\tQUANTITY\tRESERVATION\n")
		for _, l := range o.GetLines() {
			fmt.Fprintf(w, "%s\t%d\t%s\n", l.GetSku(), l.GetQuantity(), dash(l.GetReservationId()))
		}
	})
}

func cmdCreateSKU(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("create-sku", flag.ContinueOnError)
	initial := fs.Int64("stock", -1, "")
	shards := fs.Int("shards", 1, "")
	maxPer := fs.Int64("max-per-order", 0, "")
	limit := fs.Int64("customer-limit", 0, "")
	ttl := fs.Duration("ttl", 0, "")
	adm := addAdmissionFlags(fs)
	pos, err := parse(fs, args, 1, "SKU -stock N")
	if err != nil {
		return err
	}
	if *initial < 0 {
		return usagef("create-sku: -stock N is required")
	}
	m := &v1.CreateSkuRequest{Sku: pos[0], InitialStock: *initial, Shards: int32(*shards), MaxPerOrder: *maxPer, CustomerLimit: *limit}
	if m.Admission, err = adm.admission(); err != nil {
		return err
	}
	if *ttl > 0 {
		m.ReservationTtl = durationpb.New(*ttl)
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.CreateSkuResponse], error) {
		return c.admin.CreateSku(ctx, req(c, m))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) { stockTable(w, resp.Msg.GetStock()) })
}

// optBool and optInt are flags that may be left unset.
type optBool struct{ v *bool }

func (o *optBool) String() string { return "" }
func (o *optBool) Set(s string) error {
	b, err := strconv.ParseBool(s)
	o.v = &b
	return err
}
func (o *optBool) IsBoolFlag() bool { return true }

type optInt struct{ v *int64 }

func (o *optInt) String() string { return "" }
func (o *optInt) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	o.v = &n
	return err
}

func cmdUpdateSKU(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("update-sku", flag.ContinueOnError)
	var paused, auto optBool
	var maxPer, limit optInt
	var start, end optTime
	fs.Var(&paused, "paused", "")
	fs.Var(&auto, "auto-shards", "")
	fs.Var(&maxPer, "max-per-order", "")
	fs.Var(&limit, "customer-limit", "")
	fs.Var(&start, "sale-start", "")
	fs.Var(&end, "sale-end", "")
	clear := fs.Bool("clear-sale-window", false, "")
	pos, err := parse(fs, args, 1, "SKU and at least one of -paused, -max-per-order, -customer-limit, -auto-shards, -sale-start, -sale-end, -clear-sale-window")
	if err != nil {
		return err
	}
	if paused.v == nil && auto.v == nil && maxPer.v == nil && limit.v == nil && start.v == nil && end.v == nil && !*clear {
		return usagef("update-sku: nothing to change")
	}
	return c.updateSKU(ctx, &v1.UpdateSkuRequest{Sku: pos[0], Paused: paused.v, AutoShards: auto.v, MaxPerOrder: maxPer.v, CustomerLimit: limit.v,
		SaleStart: start.v, SaleEnd: end.v, ClearSaleWindow: *clear})
}

// optTime is a flag for a time, RFC 3339 or +DURATION from now, that may
// be left unset.
type optTime struct{ v *timestamppb.Timestamp }

func (o *optTime) String() string { return "" }
func (o *optTime) Set(s string) error {
	if d, ok := strings.CutPrefix(s, "+"); ok {
		dur, err := time.ParseDuration(d)
		if err != nil {
			return err
		}
		o.v = timestamppb.New(time.Now().Add(dur))
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("want RFC 3339 (2026-12-24T18:00:00Z) or +DURATION: %w", err)
	}
	o.v = timestamppb.New(t)
	return nil
}

func cmdSKUs(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("skus", flag.ContinueOnError)
	prefix := fs.String("prefix", "", "")
	status := fs.String("status", "", "")
	all := fs.Bool("all", false, "")
	size := fs.Int("page-size", 100, "")
	token := fs.String("page-token", "", "")
	if _, err := parse(fs, args, 0, "no arguments besides flags"); err != nil {
		return err
	}
	var st v1.SkuStatus
	if *status != "" {
		v, ok := v1.SkuStatus_value["SKU_STATUS_"+strings.ToUpper(*status)]
		if !ok {
			return usagef("skus: -status %q: want active or paused", *status)
		}
		st = v1.SkuStatus(v)
	}
	header := true
	return pages(ctx, c, *all, *token, func(ctx context.Context, tok string) (*v1.ListSkusResponse, string, error) {
		resp, err := c.admin.ListSkus(ctx, req(c, &v1.ListSkusRequest{Prefix: *prefix, Status: st, PageSize: int32(*size), PageToken: tok}))
		if err != nil {
			return nil, "", err
		}
		return resp.Msg, resp.Msg.GetNextPageToken(), nil
	}, func(m *v1.ListSkusResponse) error {
		return c.show(m, func(w *tabwriter.Writer) {
			if header {
				fmt.Fprintf(w, "SKU\tSTATUS\tDATABASE\tAVAILABLE\tRESERVED\tSOLD\tIN TRANSIT\tSALE WINDOW\n")
				header = false
			}
			for _, s := range m.GetSkus() {
				cfg := s.GetSku()
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", cfg.GetSku(), strings.TrimPrefix(cfg.GetStatus().String(), "SKU_STATUS_"),
					s.GetDatabase(), s.GetAvailable(), s.GetReserved(), s.GetSold(), s.GetInTransit(), window(cfg))
			}
		})
	})
}

// window is a SKU's sale window as a table shows it.
func window(s *v1.SkuConfig) string {
	if s.GetSaleStart() == nil && s.GetSaleEnd() == nil {
		return "-"
	}
	at := func(t *timestamppb.Timestamp) string {
		if t == nil {
			return ""
		}
		return t.AsTime().UTC().Format(time.RFC3339)
	}
	return at(s.GetSaleStart()) + ".." + at(s.GetSaleEnd())
}

func cmdPrewarm(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("prewarm", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() == 0 {
		return usagef("prewarm: name at least one SKU")
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.PrewarmResponse], error) {
		return c.admin.Prewarm(ctx, req(c, &v1.PrewarmRequest{Skus: fs.Args()}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "SKU\tSHARDS WARM\tAVAILABLE\n")
		for _, s := range resp.Msg.GetSkus() {
			fmt.Fprintf(w, "%s\t%d\t%d\n", s.GetSku(), s.GetShardsWarm(), s.GetStock().GetAvailable())
		}
	})
}

func cmdPause(ctx context.Context, c *cli, args []string, paused bool) error {
	name := map[bool]string{true: "pause", false: "resume"}[paused]
	pos, err := parse(flag.NewFlagSet(name, flag.ContinueOnError), args, 1, "SKU")
	if err != nil {
		return err
	}
	return c.updateSKU(ctx, &v1.UpdateSkuRequest{Sku: pos[0], Paused: &paused})
}

func (c *cli) updateSKU(ctx context.Context, m *v1.UpdateSkuRequest) error {
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.UpdateSkuResponse], error) {
		return c.admin.UpdateSku(ctx, req(c, m))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		s := resp.Msg.GetSku()
		fmt.Fprintf(w, "SKU\tSTATUS\tSHARDS\tMAX PER ORDER\tCUSTOMER LIMIT\tSALE WINDOW\n")
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\n", s.GetSku(), strings.TrimPrefix(s.GetStatus().String(), "SKU_STATUS_"), s.GetShards(), s.GetMaxPerOrder(), s.GetCustomerLimit(), window(s))
	})
}

func cmdAdjust(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("adjust-stock", flag.ContinueOnError)
	delta := fs.Int64("delta", 0, "")
	reason := fs.String("reason", "", "")
	approver := fs.String("approver", "", "")
	key := fs.String("key", "", "")
	pos, err := parse(fs, args, 1, "SKU -delta N -reason R -approver A")
	if err != nil {
		return err
	}
	if *key == "" {
		*key = fmt.Sprintf("stockctl-%d", time.Now().UnixNano())
		fmt.Fprintf(c.errw, "stockctl: idempotency key %s (give it with -key to retry safely)\n", *key)
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.AdjustStockResponse], error) {
		return c.admin.AdjustStock(ctx, req(c, &v1.AdjustStockRequest{Sku: pos[0], Delta: *delta, Reason: *reason, Approver: *approver, IdempotencyKey: *key}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) { stockTable(w, resp.Msg.GetStock()) })
}

func cmdSetShards(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("set-shards", flag.ContinueOnError), args, 2, "SKU N")
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(pos[1])
	if err != nil {
		return usagef("set-shards: N %q is not a number", pos[1])
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.SetShardsResponse], error) {
		return c.admin.SetShards(ctx, req(c, &v1.SetShardsRequest{Sku: pos[0], Shards: int32(n)}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) { stockTable(w, resp.Msg.GetStock()) })
}

func transferTable(w *tabwriter.Writer, ts []*v1.Transfer) {
	fmt.Fprintf(w, "ID\tSKU\tFROM\tTO\tQUANTITY\tSTATE\tTOKEN\tREASON\n")
	for _, t := range ts {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\n", dash(t.GetTransferId()), t.GetSku(), t.GetFromShard(), t.GetToShard(), t.GetQuantity(),
			strings.TrimPrefix(t.GetState().String(), "TRANSFER_STATE_"), t.GetFenceToken(), dash(t.GetReason()))
	}
}

func cmdRebalance(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("rebalance", flag.ContinueOnError)
	dry := fs.Bool("dry-run", false, "")
	wait := fs.Bool("wait", false, "")
	pos, err := parse(fs, args, 1, "SKU")
	if err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.RebalanceResponse], error) {
		return c.admin.Rebalance(ctx, req(c, &v1.RebalanceRequest{Sku: pos[0], DryRun: *dry}))
	})
	if err != nil {
		return err
	}
	if err := c.show(resp.Msg, func(w *tabwriter.Writer) { transferTable(w, resp.Msg.GetTransfers()) }); err != nil {
		return err
	}
	if *wait && !*dry {
		return c.waitMoves(ctx, pos[0])
	}
	return nil
}

// waitMoves shows a progress bar until the SKU has no transfer in flight
// (or ctx ends).
func (c *cli) waitMoves(ctx context.Context, sku string) error {
	bar := progressbar.NewOptions(-1, progressbar.OptionSetWriter(c.errw), progressbar.OptionSetDescription("moves in flight for "+sku),
		progressbar.OptionSpinnerType(14), progressbar.OptionClearOnFinish())
	defer bar.Finish()
	for {
		resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetStockResponse], error) {
			return c.inv.GetStock(ctx, req(c, &v1.GetStockRequest{Sku: sku}))
		})
		if err != nil {
			return err
		}
		if len(resp.Msg.GetStock().GetMoving()) == 0 && resp.Msg.GetStock().GetInTransit() == 0 {
			return nil
		}
		bar.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pages fetches pages until one is short or -all is off, printing each.
func pages[T any](ctx context.Context, c *cli, all bool, token string, fetch func(ctx context.Context, token string) (T, string, error), print func(T) error) error {
	for {
		msg, next, err := call2(ctx, c, token, fetch)
		if err != nil {
			return err
		}
		if err := print(msg); err != nil {
			return err
		}
		if !all || next == "" {
			if next != "" && !c.json {
				fmt.Fprintf(c.errw, "stockctl: more: -page-token %s (or -all)\n", next)
			}
			return nil
		}
		token = next
	}
}

func call2[T any](ctx context.Context, c *cli, token string, fetch func(ctx context.Context, token string) (T, string, error)) (T, string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return fetch(ctx, token)
}

func cmdTransfers(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("transfers", flag.ContinueOnError)
	sku := fs.String("sku", "", "")
	state := fs.String("state", "", "")
	all := fs.Bool("all", false, "")
	size := fs.Int("page-size", 100, "")
	token := fs.String("page-token", "", "")
	if _, err := parse(fs, args, 0, "no arguments besides flags"); err != nil {
		return err
	}
	var st v1.TransferState
	if *state != "" {
		v, ok := v1.TransferState_value["TRANSFER_STATE_"+strings.ToUpper(*state)]
		if !ok {
			return usagef("transfers: -state %q: want pending, debited, credited, aborted or planned", *state)
		}
		st = v1.TransferState(v)
	}
	return pages(ctx, c, *all, *token, func(ctx context.Context, tok string) (*v1.ListTransfersResponse, string, error) {
		resp, err := c.admin.ListTransfers(ctx, req(c, &v1.ListTransfersRequest{Sku: *sku, State: st, PageSize: int32(*size), PageToken: tok}))
		if err != nil {
			return nil, "", err
		}
		return resp.Msg, resp.Msg.GetNextPageToken(), nil
	}, func(m *v1.ListTransfersResponse) error {
		return c.show(m, func(w *tabwriter.Writer) { transferTable(w, m.GetTransfers()) })
	})
}

func cmdTopology(ctx context.Context, c *cli, args []string) error {
	if _, err := parse(flag.NewFlagSet("topology", flag.ContinueOnError), args, 0, "no arguments"); err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetTopologyResponse], error) {
		return c.admin.GetTopology(ctx, req(c, &v1.GetTopologyRequest{}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		m := resp.Msg
		owned := len(m.GetOwners())
		fmt.Fprintf(w, "PARTITIONS\tOWNED\n%d\t%d\n\nSERVER\tADDRESS\tPARTITIONS\n", m.GetPartitions(), owned)
		for _, s := range m.GetServers() {
			fmt.Fprintf(w, "%s\t%s\t%d\n", s.GetServerId(), s.GetAddress(), len(s.GetPartitions()))
		}
		if len(m.GetMoveLeases()) > 0 {
			fmt.Fprintf(w, "\nMOVING SKU\tHOLDER\tTOKEN\n")
			for _, l := range m.GetMoveLeases() {
				fmt.Fprintf(w, "%s\t%s\t%d\n", l.GetSku(), l.GetHolder(), l.GetToken())
			}
		}
		if p := m.GetPlacement(); p != nil {
			fmt.Fprintf(w, "\nDATABASE\tSLOTS\tCONFIGURED\t(placement version %d of %d kept)\n", p.GetVersion(), p.GetVersions())
			for _, d := range p.GetDatabases() {
				fmt.Fprintf(w, "%s\t%d\t%v\t\n", d.GetName(), d.GetSlots(), d.GetConfigured())
			}
		}
	})
}

func cmdLedger(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	all := fs.Bool("all", false, "")
	size := fs.Int("page-size", 100, "")
	token := fs.String("page-token", "", "")
	pos, err := parse(fs, args, 1, "SKU")
	if err != nil {
		return err
	}
	return pages(ctx, c, *all, *token, func(ctx context.Context, tok string) (*v1.ListLedgerResponse, string, error) {
		resp, err := c.admin.ListLedger(ctx, req(c, &v1.ListLedgerRequest{Sku: pos[0], PageSize: int32(*size), PageToken: tok}))
		if err != nil {
			return nil, "", err
		}
		return resp.Msg, resp.Msg.GetNextPageToken(), nil
	}, func(m *v1.ListLedgerResponse) error {
		return c.show(m, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, ledgerHeader)
			for _, e := range m.GetEntries() {
				fmt.Fprintln(w, ledgerRow(e))
			}
		})
	})
}

// ledgerHeader heads the columns of ledgerRow.
const ledgerHeader = "ID\tSHARD\tKIND\tQUANTITY\tAVAILABLE\tRESERVED\tSOLD\tKEY\tSOURCE\tCREATED"

// ledgerRow is an entry's line of a table, its columns tab-separated.
func ledgerRow(e *v1.LedgerEntry) string {
	return fmt.Sprintf("%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s", e.GetId(), e.GetShard(), e.GetKind(), e.GetQuantity(),
		e.GetAvailableAfter(), e.GetReservedAfter(), e.GetSoldAfter(), dash(e.GetIdempotencyKey()), e.GetSource(),
		e.GetCreatedAt().AsTime().Format(time.RFC3339))
}

func cmdReconcile(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("reconcile", flag.ContinueOnError), args, 1, "SKU")
	if err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.ReconcileResponse], error) {
		return c.admin.Reconcile(ctx, req(c, &v1.ReconcileRequest{Sku: pos[0]}))
	})
	if err != nil {
		return err
	}
	if err := c.show(resp.Msg, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "SKU\tBALANCED\tDISCREPANCIES\n%s\t%v\t%d\n", pos[0], resp.Msg.GetBalanced(), len(resp.Msg.GetDiscrepancies()))
		for _, d := range resp.Msg.GetDiscrepancies() {
			fmt.Fprintf(w, "  %s\tshard %d\texpected %d, actual %d: %s\n", d.GetCheck(), d.GetShard(), d.GetExpected(), d.GetActual(), d.GetDetail())
		}
	}); err != nil {
		return err
	}
	if !resp.Msg.GetBalanced() {
		return errors.New("the books do not balance")
	}
	return nil
}

func cmdResumeShard(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("resume-shard", flag.ContinueOnError)
	approver := fs.String("approver", "", "")
	reason := fs.String("reason", "", "")
	pos, err := parse(fs, args, 2, "SKU INDEX -approver A -reason R")
	if err != nil {
		return err
	}
	idx, err := strconv.Atoi(pos[1])
	if err != nil {
		return usagef("resume-shard: INDEX %q is not a number", pos[1])
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.ResumeShardResponse], error) {
		return c.admin.ResumeShard(ctx, req(c, &v1.ResumeShardRequest{Sku: pos[0], Index: int32(idx), Approver: *approver, Reason: *reason}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "it had halted because: %s\n\n", resp.Msg.GetHaltedReason())
		stockTable(w, resp.Msg.GetStock())
	})
}

func cmdSetPlacement(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("set-placement", flag.ContinueOnError), args, -1, "DB [DB...]")
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("set-placement: name at least one database")
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.SetPlacementResponse], error) {
		return c.admin.SetPlacement(ctx, req(c, &v1.SetPlacementRequest{Databases: pos}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		p := resp.Msg.GetPlacement()
		fmt.Fprintf(w, "DATABASE\tSLOTS\tCONFIGURED\t(placement version %d)\n", p.GetVersion())
		for _, d := range p.GetDatabases() {
			fmt.Fprintf(w, "%s\t%d\t%v\t\n", d.GetName(), d.GetSlots(), d.GetConfigured())
		}
	})
}

// cmdBumpEtcdRevision is the way back after etcd was restored without
// --bump-revision or rebuilt (docs/operations.md, "etcd restored or
// rebuilt"): it talks to etcd itself, not to the admin API, whose
// allocators are not ready then.
func cmdBumpEtcdRevision(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("bump-etcd-revision", flag.ContinueOnError)
	endpoints := fs.String("etcd-endpoints", c.getenv("ETCD_ENDPOINTS"), "")
	ca := fs.String("etcd-ca", c.getenv("ETCD_CACERT"), "")
	cert := fs.String("etcd-cert", c.getenv("ETCD_CERT"), "")
	key := fs.String("etcd-key", c.getenv("ETCD_KEY"), "")
	pos, err := parse(fs, args, 1, "PAST")
	if err != nil {
		return err
	}
	past, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || past <= 0 {
		return usagef("bump-etcd-revision: PAST %q: want a positive revision", pos[0])
	}
	client, err := startup.EtcdTLS(startup.EtcdConfig{Endpoints: *endpoints, CA: *ca, Cert: *cert, Key: *key})
	if err != nil {
		return err
	}
	defer client.Close()
	rev, err := topology.BumpRevision(ctx, client, past)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "etcd revision %d (asked at least %d)\n", rev, past)
	return nil
}

// importRow is one CSV line of import.
func importRow(rec []string) (*v1.CreateSkuRequest, error) {
	if len(rec) < 2 || len(rec) > 5 {
		return nil, fmt.Errorf("want sku,stock[,shards,max_per_order,customer_limit], got %d fields", len(rec))
	}
	nums := make([]int64, 4)
	nums[1] = 1 // shards
	for i, f := range rec[1:] {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("field %d: %q is not a number", i+2, f)
		}
		nums[i] = n
	}
	return &v1.CreateSkuRequest{Sku: strings.TrimSpace(rec[0]), InitialStock: nums[0], Shards: int32(nums[1]), MaxPerOrder: nums[2], CustomerLimit: nums[3]}, nil
}

func cmdImport(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	progress := fs.Bool("progress", isTerminal(c.errw), "")
	stopOnError := fs.Bool("stop-on-error", false, "")
	pos, err := parse(fs, args, 1, "FILE.csv")
	if err != nil {
		return err
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return usagef("import: %v", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return usagef("import: %s: %v", pos[0], err)
	}
	if len(recs) > 0 && strings.EqualFold(strings.TrimSpace(recs[0][0]), "sku") {
		recs = recs[1:]
	}
	var bar *progressbar.ProgressBar
	if *progress {
		bar = progressbar.NewOptions(len(recs), progressbar.OptionSetWriter(c.errw), progressbar.OptionSetDescription("importing SKUs"),
			progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
	}
	var created, skipped, failed int
	var firstErr error
	for i, rec := range recs {
		if bar != nil {
			bar.Add(1)
		}
		m, err := importRow(rec)
		if err == nil {
			_, err = call(ctx, c, func(ctx context.Context) (*connect.Response[v1.CreateSkuResponse], error) {
				return c.admin.CreateSku(ctx, req(c, m))
			})
		}
		switch {
		case err == nil:
			created++
		case connect.CodeOf(err) == connect.CodeAlreadyExists:
			skipped++
		default:
			failed++
			fmt.Fprintf(c.errw, "stockctl: import: line %d: %v\n", i+1, err)
			if firstErr == nil {
				firstErr = err
			}
			var ce *connect.Error
			if *stopOnError || (errors.As(err, &ce) && (ce.Code() == connect.CodeUnauthenticated || ce.Code() == connect.CodePermissionDenied)) {
				recs = recs[:i+1]
			}
		}
		if failed > 0 && len(recs) == i+1 {
			break
		}
	}
	if bar != nil {
		bar.Finish()
	}
	if c.json {
		b, _ := json.Marshal(map[string]int{"created": created, "skipped": skipped, "failed": failed})
		fmt.Fprintln(c.out, string(b))
	} else {
		w := tabwriter.NewWriter(c.out, 2, 4, 2, ' ', 0)
		fmt.Fprintf(w, "CREATED\tSKIPPED (EXISTED)\tFAILED\n%d\t%d\t%d\n", created, skipped, failed)
		w.Flush()
	}
	return firstErr
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
