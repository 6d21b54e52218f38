package wire

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
)

var when = time.Date(2026, 3, 1, 12, 30, 0, 500, time.UTC)

func TestConvert_Request(t *testing.T) {
	for _, kind := range []stock.OpKind{stock.OpReserve, stock.OpCommit, stock.OpRelease, stock.OpDeduct,
		stock.OpReplenish, stock.OpAdjust, stock.OpTransferOut, stock.OpTransferIn} {
		t.Run(string(kind), func(t *testing.T) {
			r := &stock.Request{Kind: kind, Shard: stock.ShardKey{SKU: "s", Index: 3}, Quantity: -4, Key: "k",
				ReservationID: "r1.x", TransferID: "t1", OrderRef: "o", CustomerRef: "c", TTL: 90 * time.Second,
				Reason: "why", Approver: "ann", Source: stock.SourceAPI}
			if got := RequestFromProto(RequestToProto(r)); !reflect.DeepEqual(got, r) {
				t.Errorf("RequestFromProto(RequestToProto(%+v)) = %+v, want it back", r, got)
			}
		})
	}
	t.Run("NoTTL", func(t *testing.T) {
		op := RequestToProto(&stock.Request{Kind: stock.OpDeduct})
		if op.Ttl != nil {
			t.Errorf("RequestToProto(no TTL).Ttl = %v, want nil", op.Ttl)
		}
	})
	t.Run("UnknownKind", func(t *testing.T) {
		if got := RequestFromProto(&v1.ShardOp{Kind: 99}); got.Kind != "" {
			t.Errorf("RequestFromProto(kind 99).Kind = %q, want \"\" (refused by validation)", got.Kind)
		}
	})
}

func TestConvert_DurationOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    *durationpb.Duration
		want time.Duration
	}{
		{"Nil", nil, 0},
		{"OK", durationpb.New(3 * time.Second), 3 * time.Second},
		{"Invalid", &durationpb.Duration{Seconds: 1, Nanos: -1}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DurationOf(tc.d); got != tc.want {
				t.Errorf("DurationOf(%v) = %v, want %v", tc.d, got, tc.want)
			}
		})
	}
}

func TestConvert_Result(t *testing.T) {
	res := &stock.Reservation{ID: "r1.x", SKU: "s", Shard: 2, Quantity: 3, State: stock.ReservationCommitted,
		ExpiresAt: when, OrderRef: "o", CustomerRef: "c", IdempotencyKey: "k"}
	op := &stock.Operation{SKU: "s", IdempotencyKey: "k", Kind: stock.OpAdjust, Quantity: -2, Shard: 1,
		ReservationID: "r1.y", OrderRef: "o", CustomerRef: "c", CreatedAt: when, ReservationState: stock.ReservationExpired,
		OrderID: "o1.z"}
	tr := &stock.Transfer{ID: "t1", SKU: "s", From: 1, To: 2, Quantity: 5, State: stock.TransferDebited, FenceToken: 12,
		CreatedAt: when, UpdatedAt: when.Add(time.Second)}
	for _, tc := range []struct {
		name string
		r    stock.Result
	}{
		{"Error", stock.Result{Err: stock.Errorf(stock.CodeOutOfStock, "none left"), Available: 0}},
		{"Reservation", stock.Result{Reservation: res, Replayed: true, Available: 7}},
		{"Operation", stock.Result{Operation: op, Available: 1}},
		{"Transfer", stock.Result{Transfer: tr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ResultFromProto(ResultToProto(tc.r)); !reflect.DeepEqual(got, tc.r) {
				t.Errorf("ResultFromProto(ResultToProto(%+v)) = %+v, want it back", tc.r, got)
			}
		})
	}
	t.Run("Empty", func(t *testing.T) {
		if got := ResultFromProto(&v1.ShardResult{}); got.Err == nil || got.Err.Code != stock.CodeInternal {
			t.Errorf("ResultFromProto(empty) = %+v, want INTERNAL", got)
		}
	})
	t.Run("States", func(t *testing.T) {
		for _, s := range []stock.ReservationState{stock.ReservationHeld, stock.ReservationCommitted, stock.ReservationReleased, stock.ReservationExpired} {
			r := *res
			r.State = s
			if got := ReservationFromProto(ReservationToProto(&r)); got.State != s {
				t.Errorf("ReservationFromProto(ReservationToProto(state %s)).State = %q", s, got.State)
			}
		}
		for _, s := range []stock.TransferState{stock.TransferPending, stock.TransferDebited, stock.TransferCredited, stock.TransferAborted, stock.TransferPlanned} {
			x := *tr
			x.State = s
			if got := TransferFromProto(TransferToProto(&x)); got.State != s {
				t.Errorf("TransferFromProto(TransferToProto(state %s)).State = %q", s, got.State)
			}
		}
		for _, k := range []stock.OpKind{stock.OpReserve, stock.OpDeduct, stock.OpReplenish, stock.OpAdjust} {
			o := *op
			o.Kind = k
			if got := OperationFromProto(OperationToProto(&o)); got.Kind != k {
				t.Errorf("OperationFromProto(OperationToProto(kind %s)).Kind = %q", k, got.Kind)
			}
		}
	})
}

func TestConvert_Transfer(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    *stock.Transfer
		want *v1.Transfer
	}{
		{"Aborted", &stock.Transfer{ID: "t1", SKU: "s", From: 3, To: 0, Quantity: 5, State: stock.TransferAborted,
			FenceToken: 41, Reason: string(stock.CodeMoveFenced), CreatedAt: when, UpdatedAt: when.Add(time.Second)},
			&v1.Transfer{TransferId: "t1", Sku: "s", FromShard: 3, ToShard: 0, Quantity: 5, State: v1.TransferState_TRANSFER_STATE_ABORTED,
				FenceToken: 41, Reason: "MOVE_FENCED", CreatedAt: timestamppb.New(when), UpdatedAt: timestamppb.New(when.Add(time.Second))}},
		{"Planned", &stock.Transfer{SKU: "s", From: 1, To: 2, Quantity: 7, State: stock.TransferPlanned},
			&v1.Transfer{Sku: "s", FromShard: 1, ToShard: 2, Quantity: 7, State: v1.TransferState_TRANSFER_STATE_PLANNED}},
		{"Credited", &stock.Transfer{ID: "t2", SKU: "s", From: 0, To: 1, Quantity: 1, State: stock.TransferCredited,
			FenceToken: 3, CreatedAt: when, UpdatedAt: when},
			&v1.Transfer{TransferId: "t2", Sku: "s", FromShard: 0, ToShard: 1, Quantity: 1, State: v1.TransferState_TRANSFER_STATE_CREDITED,
				FenceToken: 3, CreatedAt: timestamppb.New(when), UpdatedAt: timestamppb.New(when)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := TransferToProto(tc.t)
			if !proto.Equal(got, tc.want) {
				t.Errorf("TransferToProto(%+v) = %v, want %v", tc.t, got, tc.want)
			}
			if back := TransferFromProto(got); !reflect.DeepEqual(back, tc.t) {
				t.Errorf("TransferFromProto(%v) = %+v, want %+v", got, back, tc.t)
			}
		})
	}
}

func TestConvert_TransferStateOf(t *testing.T) {
	for _, tc := range []struct {
		s      v1.TransferState
		want   stock.TransferState
		wantOK bool
	}{
		{v1.TransferState_TRANSFER_STATE_UNSPECIFIED, "", false},
		{v1.TransferState_TRANSFER_STATE_PENDING, stock.TransferPending, true},
		{v1.TransferState_TRANSFER_STATE_DEBITED, stock.TransferDebited, true},
		{v1.TransferState_TRANSFER_STATE_CREDITED, stock.TransferCredited, true},
		{v1.TransferState_TRANSFER_STATE_ABORTED, stock.TransferAborted, true},
		{v1.TransferState_TRANSFER_STATE_PLANNED, stock.TransferPlanned, true},
		{99, "", false},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			if got, ok := TransferStateOf(tc.s); got != tc.want || ok != tc.wantOK {
				t.Errorf("TransferStateOf(%v) = %q, %v, want %q, %v", tc.s, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestConvert_MoveLease(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    *stock.MoveLease
		want *v1.MoveLease
	}{
		{"Held", &stock.MoveLease{SKU: "s", Holder: "allocator-1", Token: 77}, &v1.MoveLease{Sku: "s", Holder: "allocator-1", Token: 77}},
		{"None", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MoveLeaseToProto(tc.l)
			if !proto.Equal(got, tc.want) {
				t.Errorf("MoveLeaseToProto(%+v) = %v, want %v", tc.l, got, tc.want)
			}
			if back := MoveLeaseFromProto(got); !reflect.DeepEqual(back, tc.l) {
				t.Errorf("MoveLeaseFromProto(%v) = %+v, want %+v", got, back, tc.l)
			}
		})
	}
}

func TestConvert_LedgerEntry(t *testing.T) {
	e := &stock.LedgerEntry{ID: 9, Shard: stock.ShardKey{SKU: "s", Index: 4}, Kind: stock.OpTransferIn, Quantity: 5,
		Before: stock.Counts{Available: 1, Reserved: 2, Sold: 3}, After: stock.Counts{Available: 6, Reserved: 2, Sold: 3},
		IdempotencyKey: "k", ReservationID: "r", TransferID: "t", OrderRef: "o", Source: "allocator", Reason: "why",
		Approver: "ann", ServerID: "s1", Epoch: 7, CreatedAt: when}
	got := LedgerEntryToProto(e)
	want := &v1.LedgerEntry{Id: 9, Sku: "s", Shard: 4, Kind: "transfer_in", Quantity: 5,
		AvailableBefore: 1, AvailableAfter: 6, ReservedBefore: 2, ReservedAfter: 2, SoldBefore: 3, SoldAfter: 3,
		IdempotencyKey: "k", ReservationId: "r", TransferId: "t", OrderRef: "o", Source: "allocator", Reason: "why",
		Approver: "ann", ServerId: "s1", Epoch: 7}
	if !got.GetCreatedAt().AsTime().Equal(when) {
		t.Errorf("LedgerEntryToProto(%+v).CreatedAt = %v, want %v", e, got.GetCreatedAt().AsTime(), when)
	}
	got.CreatedAt = nil
	if !proto.Equal(got, want) {
		t.Errorf("LedgerEntryToProto(%+v) = %v, want %v", e, got, want)
	}
}
