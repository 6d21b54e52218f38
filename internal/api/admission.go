package api

import (
	"context"
	"encoding/hex"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// admissionOf is the handler's admission service, or UNIMPLEMENTED where
// the process serves none.
func (h *InventoryHandler) admissionOf() (*admission.Service, error) {
	if h.Admission == nil {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeUnimplemented, "this server does not serve admission"))
	}
	return h.Admission, nil
}

// RequestToken asks for a purchase token of a SKU under admission.
func (h *InventoryHandler) RequestToken(ctx context.Context, req *connect.Request[v1.RequestTokenRequest]) (*connect.Response[v1.RequestTokenResponse], error) {
	svc, err := h.admissionOf()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	ans, err := svc.RequestToken(ctx, admission.TokenRequest{SKU: m.GetSku(), Quantity: m.GetQuantity(), Key: m.GetIdempotencyKey(),
		CustomerRef: customerOf(ctx, m.GetCustomerRef()), Caller: callerOf(ctx)})
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.RequestTokenResponse{Replayed: ans.Replayed}
	if ans.Ticket.State == stock.TicketAdmitted && ans.Ticket.Direct {
		out.Token = tokenToProto(ans.Ticket)
	} else {
		out.Ticket = ticketToProto(ans.Ticket)
	}
	return connect.NewResponse(out), nil
}

// GetTicket reads a ticket by id, or by sku and key (a public caller only
// its own customer's).
func (h *InventoryHandler) GetTicket(ctx context.Context, req *connect.Request[v1.GetTicketRequest]) (*connect.Response[v1.GetTicketResponse], error) {
	svc, err := h.admissionOf()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	t, err := svc.GetTicket(ctx, m.GetTicketId(), m.GetSku(), m.GetIdempotencyKey())
	if err == nil && m.GetTicketId() == "" {
		if c, ok := auth.CallerFrom(ctx); ok && c.Role == auth.RolePublic && c.Customer != t.CustomerRef {
			err = stock.Errorf(stock.CodeTicketNotFound, "no such ticket")
		}
	}
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.GetTicketResponse{Ticket: ticketToProto(t)}), nil
}

// CancelTicket takes a waiting ticket out of the waitlist.
func (h *InventoryHandler) CancelTicket(ctx context.Context, req *connect.Request[v1.CancelTicketRequest]) (*connect.Response[v1.CancelTicketResponse], error) {
	svc, err := h.admissionOf()
	if err != nil {
		return nil, err
	}
	var customer string
	if c, ok := auth.CallerFrom(ctx); ok && c.Role == auth.RolePublic {
		customer = c.Customer
	}
	t, err := svc.CancelTicket(ctx, req.Msg.GetTicketId(), customer)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&v1.CancelTicketResponse{Ticket: ticketToProto(t)}), nil
}

// WatchTicket streams a ticket until it no longer waits.
func (h *InventoryHandler) WatchTicket(ctx context.Context, req *connect.Request[v1.WatchTicketRequest], out *connect.ServerStream[v1.WatchTicketResponse]) error {
	svc, err := h.admissionOf()
	if err != nil {
		return err
	}
	guard, stop := guardSends(ctx, h.WatchSendMax)
	defer stop()
	err = svc.WatchTicket(ctx, req.Msg.GetTicketId(), func(t *stock.Ticket) error {
		msg := &v1.WatchTicketResponse{Ticket: ticketToProto(t)}
		return guard.send(func() error { return out.Send(msg) })
	})
	if err != nil {
		return wire.ToConnect(err)
	}
	return nil
}

var ticketStates = map[stock.TicketState]v1.TicketState{
	// A pending ticket's request is being served: to a reader it waits,
	// at the head.
	stock.TicketPending:    v1.TicketState_TICKET_STATE_WAITING,
	stock.TicketWaiting:    v1.TicketState_TICKET_STATE_WAITING,
	stock.TicketAdmitted:   v1.TicketState_TICKET_STATE_ADMITTED,
	stock.TicketSoldOut:    v1.TicketState_TICKET_STATE_SOLD_OUT,
	stock.TicketCancelled:  v1.TicketState_TICKET_STATE_CANCELLED,
	stock.TicketRegistered: v1.TicketState_TICKET_STATE_REGISTERED,
	stock.TicketLost:       v1.TicketState_TICKET_STATE_LOST,
}

func tokenToProto(t *stock.Ticket) *v1.Token {
	return &v1.Token{TokenId: t.TokenID, Sku: t.SKU, Quantity: t.Quantity, ExpiresAt: protoTime(t.ExpiresAt)}
}

func ticketToProto(t *stock.Ticket) *v1.Ticket {
	out := &v1.Ticket{TicketId: t.ID, Sku: t.SKU, Quantity: t.Quantity, State: ticketStates[t.State], Position: t.Position,
		IdempotencyKey: t.IdempotencyKey, CreatedAt: timestamppb.New(t.CreatedAt), DrawRank: t.Rank}
	if t.State == stock.TicketAdmitted {
		out.Token = tokenToProto(t)
	}
	return out
}

var drawStates = map[stock.DrawState]v1.DrawState{
	stock.DrawRegistering: v1.DrawState_DRAW_STATE_REGISTERING,
	stock.DrawSeeded:      v1.DrawState_DRAW_STATE_SEEDED,
	stock.DrawDrawn:       v1.DrawState_DRAW_STATE_DRAWN,
}

// drawSummary is a draw's state for GetStock.
func drawSummary(d *stock.Draw) *v1.DrawSummary {
	out := &v1.DrawSummary{State: drawStates[d.State], DrawAt: protoTime(d.DrawAt), Tickets: d.Total, SeedRecorded: len(d.Seed) > 0,
		Winners: d.Winners}
	if d.State == stock.DrawDrawn {
		out.DrawnAt = protoTime(d.DrawnAt)
	}
	return out
}

// GetDraw reads a SKU's draw, a page of its drawn order at a time; the
// page token is the rank of the last ticket of the page before.
func (h *InventoryHandler) GetDraw(ctx context.Context, req *connect.Request[v1.GetDrawRequest]) (*connect.Response[v1.GetDrawResponse], error) {
	svc, err := h.admissionOf()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	var after int64
	if tok := m.GetPageToken(); tok != "" {
		if after, err = strconv.ParseInt(tok, 10, 64); err != nil || after < 0 {
			return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "page_token must be the next_page_token of a page"))
		}
	}
	d, err := svc.GetDraw(ctx, m.GetSku(), after, int(m.GetPageSize()))
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.GetDrawResponse{Sku: d.SKU, State: drawStates[d.State], DrawAt: protoTime(d.DrawAt), Seed: hex.EncodeToString(d.Seed),
		Tickets: d.Total, TicketIds: d.Tickets}
	if last := after + int64(len(d.Tickets)); len(d.Tickets) > 0 && last < d.Total {
		out.NextPageToken = strconv.FormatInt(last, 10)
	}
	return connect.NewResponse(out), nil
}
