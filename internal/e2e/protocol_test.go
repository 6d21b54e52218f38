package e2e

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/transport"
)

// sharedProtocols (TestE2E_Shared/Protocols): Connect, gRPC and gRPC-Web
// clients each reserve and commit on the one port, and see errors with
// their reasons.
func sharedProtocols(t *testing.T, s *stack) {
	s.createSKU("proto", 30, 2)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"Connect", nil},
		{"gRPC", []connect.ClientOption{connect.WithGRPC()}},
		{"gRPCWeb", []connect.ClientOption{connect.WithGRPCWeb()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), s.base, append(tc.opts, asService)...)
			key := fmt.Sprintf("proto-%s", tc.name)
			res, err := c.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{Sku: "proto", Quantity: 2, IdempotencyKey: key}))
			if err != nil {
				t.Fatalf("Reserve = %v", err)
			}
			if st := res.Msg.Reservation.State; st != v1.ReservationState_RESERVATION_STATE_HELD {
				t.Errorf("Reserve state = %s, want HELD", st)
			}
			com, err := c.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: res.Msg.Reservation.ReservationId}))
			if err != nil {
				t.Fatalf("Commit = %v", err)
			}
			if st := com.Msg.Reservation.State; st != v1.ReservationState_RESERVATION_STATE_COMMITTED || com.Msg.Replayed {
				t.Errorf("Commit = %v, want COMMITTED, not replayed", com.Msg)
			}
			again, err := c.Commit(ctx, connect.NewRequest(&v1.CommitRequest{ReservationId: res.Msg.Reservation.ReservationId}))
			if err != nil || !again.Msg.Replayed {
				t.Errorf("second Commit = %v, %v, want a replay", again, err)
			}
			_, err = c.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{ReservationId: res.Msg.Reservation.ReservationId}))
			if reason(err) != "RESERVATION_ALREADY_COMMITTED" {
				t.Errorf("Release after Commit = %v, want RESERVATION_ALREADY_COMMITTED in the error details", err)
			}
		})
	}
	if st := s.stock("proto"); st.Sold != 6 || st.Available != 24 {
		t.Errorf("stock = %v, want 6 sold, 24 available", st)
	}
	s.reconcile("proto")
}
