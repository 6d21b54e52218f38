package stockctlcmd

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// admissionFlags are create-sku's admission flags (docs/admission.md).
type admissionFlags struct {
	mode                 *string
	tokenTTL             *time.Duration
	waitlistMax, perCust *int64
	drawAt               *optTime
}

func addAdmissionFlags(fs *flag.FlagSet) admissionFlags {
	f := admissionFlags{mode: fs.String("admission", "", ""), tokenTTL: fs.Duration("token-ttl", 0, ""),
		waitlistMax: fs.Int64("waitlist-max", 0, ""), perCust: fs.Int64("tokens-per-customer", 0, ""), drawAt: &optTime{}}
	fs.Var(f.drawAt, "draw-at", "")
	return f
}

// admission is the flags' admission: nil without -admission.
func (f admissionFlags) admission() (*v1.Admission, error) {
	var mode v1.AdmissionMode
	switch *f.mode {
	case "":
		return nil, nil
	case "off":
	case "tokens":
		mode = v1.AdmissionMode_ADMISSION_MODE_TOKENS
	case "draw":
		mode = v1.AdmissionMode_ADMISSION_MODE_DRAW
	default:
		return nil, usagef("-admission: want tokens, draw or off, not %q", *f.mode)
	}
	a := &v1.Admission{Mode: mode, WaitlistMax: *f.waitlistMax, TokensPerCustomer: *f.perCust, DrawAt: f.drawAt.v}
	if *f.tokenTTL > 0 {
		a.TokenTtl = durationpb.New(*f.tokenTTL)
	}
	return a, nil
}

func cmdRequestToken(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("request-token", flag.ContinueOnError)
	key := fs.String("key", "", "")
	quantity := fs.Int64("quantity", 1, "")
	customer := fs.String("customer", "", "")
	pos, err := parse(fs, args, 1, "SKU -key K")
	if err != nil {
		return err
	}
	if *key == "" {
		return usagef("request-token: -key K is required")
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.RequestTokenResponse], error) {
		return c.inv.RequestToken(ctx, req(c, &v1.RequestTokenRequest{Sku: pos[0], Quantity: *quantity, IdempotencyKey: *key, CustomerRef: *customer}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) {
		if tk := resp.Msg.GetToken(); tk != nil {
			tokenTable(w, tk)
			return
		}
		ticketTable(w, resp.Msg.GetTicket())
	})
}

func cmdTicket(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("ticket", flag.ContinueOnError)
	sku := fs.String("sku", "", "")
	key := fs.String("key", "", "")
	pos, err := parse(fs, args, -1, "")
	if err != nil {
		return err
	}
	if (len(pos) == 1) == (*key != "") || len(pos) > 1 || (*key != "") != (*sku != "") {
		return usagef("ticket: want TICKET_ID, or -sku SKU -key KEY")
	}
	m := &v1.GetTicketRequest{Sku: *sku, IdempotencyKey: *key}
	if len(pos) == 1 {
		m.TicketId = pos[0]
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetTicketResponse], error) {
		return c.inv.GetTicket(ctx, req(c, m))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) { ticketTable(w, resp.Msg.GetTicket()) })
}

func cmdCancelTicket(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("cancel-ticket", flag.ContinueOnError), args, 1, "TICKET_ID")
	if err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.CancelTicketResponse], error) {
		return c.inv.CancelTicket(ctx, req(c, &v1.CancelTicketRequest{TicketId: pos[0]}))
	})
	if err != nil {
		return err
	}
	return c.show(resp.Msg, func(w *tabwriter.Writer) { ticketTable(w, resp.Msg.GetTicket()) })
}

// cmdWatchTicket follows a ticket (WatchTicket): a line as it is, then one
// for each change of position or state, until its outcome (the server
// ends the stream) or ctx ends. The server ends a stream after
// watchLenMax; the command then ends with an error, to watch again.
func cmdWatchTicket(ctx context.Context, c *cli, args []string) error {
	pos, err := parse(flag.NewFlagSet("watch-ticket", flag.ContinueOnError), args, 1, "TICKET_ID")
	if err != nil {
		return err
	}
	s, err := c.inv.WatchTicket(ctx, req(c, &v1.WatchTicketRequest{TicketId: pos[0]}))
	if err != nil {
		return err
	}
	defer s.Close()
	if !c.json {
		fmt.Fprintln(c.out, ticketHeader)
	}
	var last *v1.Ticket
	for s.Receive() {
		m := s.Msg()
		last = m.GetTicket()
		if err := c.line(m, func() string { return ticketRow(last) }); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := s.Err(); err != nil {
		return err
	}
	if last == nil || !ended(last.GetState()) {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the stream ended before the ticket's outcome; watch again"))
	}
	return nil
}

// ended reports whether a ticket's state is an outcome.
func ended(st v1.TicketState) bool {
	switch st {
	case v1.TicketState_TICKET_STATE_WAITING, v1.TicketState_TICKET_STATE_REGISTERED,
		v1.TicketState_TICKET_STATE_UNSPECIFIED:
		return false
	}
	return true
}

func tokenTable(w *tabwriter.Writer, tk *v1.Token) {
	fmt.Fprintf(w, "TOKEN\tSKU\tQUANTITY\tEXPIRES\n%s\t%s\t%d\t%s\n", tk.GetTokenId(), tk.GetSku(), tk.GetQuantity(),
		tk.GetExpiresAt().AsTime().Format(time.RFC3339))
}

const ticketHeader = "TICKET\tSKU\tQUANTITY\tSTATE\tPOSITION\tTOKEN"

func ticketTable(w *tabwriter.Writer, t *v1.Ticket) {
	fmt.Fprintf(w, "%s\n%s\n", ticketHeader, ticketRow(t))
}

func ticketRow(t *v1.Ticket) string {
	return fmt.Sprintf("%s\t%s\t%d\t%s\t%d\t%s", t.GetTicketId(), t.GetSku(), t.GetQuantity(),
		strings.TrimPrefix(t.GetState().String(), "TICKET_STATE_"), t.GetPosition(), dash(t.GetToken().GetTokenId()))
}

func cmdDraw(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("draw", flag.ContinueOnError)
	page := fs.String("page-token", "", "")
	size := fs.Int("page-size", 0, "")
	pos, err := parse(fs, args, 1, "SKU")
	if err != nil {
		return err
	}
	resp, err := call(ctx, c, func(ctx context.Context) (*connect.Response[v1.GetDrawResponse], error) {
		return c.inv.GetDraw(ctx, req(c, &v1.GetDrawRequest{Sku: pos[0], PageToken: *page, PageSize: int32(*size)}))
	})
	if err != nil {
		return err
	}
	m := resp.Msg
	return c.show(m, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "SKU\tSTATE\tDRAW AT\tTICKETS\tSEED\n%s\t%s\t%s\t%d\t%s\n", m.GetSku(), strings.TrimPrefix(m.GetState().String(), "DRAW_STATE_"),
			m.GetDrawAt().AsTime().Format(time.RFC3339), m.GetTickets(), dash(m.GetSeed()))
		if len(m.GetTicketIds()) > 0 {
			fmt.Fprintf(w, "\nDRAWN\n%s\n", strings.Join(m.GetTicketIds(), "\n"))
		}
		if m.GetNextPageToken() != "" {
			fmt.Fprintf(w, "next: -page-token %s\n", m.GetNextPageToken())
		}
	})
}
