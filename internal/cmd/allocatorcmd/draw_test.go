package allocatorcmd_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// TestRun_Draw: a draw over Connect, end to end through the command:
// CreateSku with ADMISSION_MODE_DRAW and draw_at, registrations answered
// REGISTERED, GetDraw read by the public role while registering, then
// (draw_at moved to now) paged in drawn order and replayed with
// admission.DrawOrder; GetDraw's hostile inputs refused INVALID_ARGUMENT.
func TestRun_Draw(t *testing.T) {
	ctx := context.Background()
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s")
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base, bearer(serviceToken))
	public := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base)
	const sku, units, registrations = "drawn", 2, 3
	ad := &v1.Admission{Mode: v1.AdmissionMode_ADMISSION_MODE_DRAW, WaitlistMax: 10, DrawAt: timestamppb.New(time.Now().Add(time.Hour))}
	if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: sku, InitialStock: units, Shards: 1, Admission: ad})); err != nil {
		t.Fatalf("CreateSku(draw) = %v", err)
	}
	if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: "plain", InitialStock: 1, Shards: 1})); err != nil {
		t.Fatalf("CreateSku(plain) = %v", err)
	}
	var ids []string
	for i := range registrations {
		resp, err := inv.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: sku, Quantity: 1, IdempotencyKey: fmt.Sprintf("k-%d", i),
			CustomerRef: fmt.Sprintf("c-%d", i)}))
		if err != nil || resp.Msg.GetTicket().GetState() != v1.TicketState_TICKET_STATE_REGISTERED {
			t.Fatalf("RequestToken(%d) = %v, %v; want a REGISTERED ticket", i, resp, err)
		}
		ids = append(ids, resp.Msg.GetTicket().GetTicketId())
	}
	// GetStock shows the draw's state to operators.
	summary := func() *v1.DrawSummary {
		t.Helper()
		st, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
		if err != nil {
			t.Fatalf("GetStock(%s) = %v", sku, err)
		}
		return st.Msg.GetDraw()
	}
	if got := summary(); got.GetState() != v1.DrawState_DRAW_STATE_REGISTERING || got.GetTickets() != registrations || got.GetSeedRecorded() ||
		got.GetWinners() != 0 || got.GetDrawnAt() != nil || !got.GetDrawAt().AsTime().Equal(ad.GetDrawAt().AsTime().Truncate(time.Microsecond)) {
		t.Errorf("GetStock(registering).draw = %v, want REGISTERING, %d tickets, no seed, no winner, draw_at %v", got, registrations, ad.GetDrawAt().AsTime())
	}
	if st, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "plain"})); err != nil || st.Msg.GetDraw() != nil {
		t.Errorf("GetStock(plain) = %v, %v; want no draw", st, err)
	}
	d, err := public.GetDraw(ctx, connect.NewRequest(&v1.GetDrawRequest{Sku: sku}))
	if err != nil || d.Msg.GetState() != v1.DrawState_DRAW_STATE_REGISTERING || d.Msg.GetTickets() != registrations || d.Msg.GetSeed() != "" ||
		!d.Msg.GetDrawAt().AsTime().Equal(ad.GetDrawAt().AsTime().Truncate(time.Microsecond)) {
		t.Fatalf("GetDraw(registering, public) = %v, %v; want REGISTERING, %d tickets, no seed, draw_at %v", d, err, registrations, ad.GetDrawAt().AsTime())
	}
	for _, m := range []*v1.GetDrawRequest{
		{Sku: ""}, {Sku: "plain"}, {Sku: sku, PageToken: "x"}, {Sku: sku, PageToken: "-1"}, {Sku: sku, PageSize: -1}, {Sku: sku, PageSize: 10_001},
	} {
		if _, err := public.GetDraw(ctx, connect.NewRequest(m)); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("GetDraw(%v) = %v, want INVALID_ARGUMENT", m, err)
		}
	}

	ad.DrawAt = timestamppb.New(time.Now().Add(-time.Second))
	if _, err := admin.UpdateSku(ctx, adminReq(&v1.UpdateSkuRequest{Sku: sku, Admission: ad})); err != nil {
		t.Fatalf("UpdateSku(draw_at now) = %v", err)
	}
	if _, err := inv.RequestToken(ctx, connect.NewRequest(&v1.RequestTokenRequest{Sku: sku, Quantity: 1, IdempotencyKey: "late", CustomerRef: "late"})); wire.Reason(err) != "SALE_ENDED" {
		t.Errorf("RequestToken(after draw_at) = %v, want SALE_ENDED", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err = public.GetDraw(ctx, connect.NewRequest(&v1.GetDrawRequest{Sku: sku, PageSize: 2}))
		if err == nil && d.Msg.GetState() == v1.DrawState_DRAW_STATE_DRAWN {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetDraw = %v, %v; want DRAWN within 10 s", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	order := d.Msg.GetTicketIds()
	if len(order) != 2 || d.Msg.GetNextPageToken() != "2" {
		t.Fatalf("GetDraw(page of 2) = %v; want 2 tickets and next page 2", d.Msg)
	}
	d, err = public.GetDraw(ctx, connect.NewRequest(&v1.GetDrawRequest{Sku: sku, PageSize: 2, PageToken: "2"}))
	if err != nil || len(d.Msg.GetTicketIds()) != 1 || d.Msg.GetNextPageToken() != "" {
		t.Fatalf("GetDraw(last page) = %v, %v; want 1 ticket, no next page", d, err)
	}
	order = append(order, d.Msg.GetTicketIds()...)
	seed, err := hex.DecodeString(d.Msg.GetSeed())
	if err != nil || len(seed) != admission.DrawSeedLen {
		t.Fatalf("GetDraw seed = %q, want %d bytes in hex", d.Msg.GetSeed(), admission.DrawSeedLen)
	}
	if replay := admission.DrawOrder([admission.DrawSeedLen]byte(seed), ids); !slices.Equal(order, replay) {
		t.Fatalf("GetDraw's order %v, DrawOrder(its seed) %v", order, replay)
	}
	for rank, id := range order {
		want := v1.TicketState_TICKET_STATE_ADMITTED
		if rank >= units {
			want = v1.TicketState_TICKET_STATE_WAITING
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := inv.GetTicket(ctx, connect.NewRequest(&v1.GetTicketRequest{TicketId: id}))
			if err == nil && got.Msg.GetTicket().GetState() == want && got.Msg.GetTicket().GetDrawRank() == int64(rank)+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GetTicket(drawn #%d) = %v, %v; want %s with draw_rank %d", rank+1, got, err, want, rank+1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := summary(); got.GetState() != v1.DrawState_DRAW_STATE_DRAWN || got.GetTickets() != registrations || !got.GetSeedRecorded() ||
		got.GetWinners() != units || got.GetDrawnAt() == nil {
		t.Errorf("GetStock(drawn).draw = %v, want DRAWN, %d tickets, the seed recorded, %d winners, drawn_at set", got, registrations, units)
	}
}
