package wire

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
)

var opKinds = map[v1.ShardOpKind]stock.OpKind{
	v1.ShardOpKind_SHARD_OP_KIND_RESERVE:      stock.OpReserve,
	v1.ShardOpKind_SHARD_OP_KIND_COMMIT:       stock.OpCommit,
	v1.ShardOpKind_SHARD_OP_KIND_RELEASE:      stock.OpRelease,
	v1.ShardOpKind_SHARD_OP_KIND_DEDUCT:       stock.OpDeduct,
	v1.ShardOpKind_SHARD_OP_KIND_REPLENISH:    stock.OpReplenish,
	v1.ShardOpKind_SHARD_OP_KIND_ADJUST:       stock.OpAdjust,
	v1.ShardOpKind_SHARD_OP_KIND_TRANSFER_OUT: stock.OpTransferOut,
	v1.ShardOpKind_SHARD_OP_KIND_TRANSFER_IN:  stock.OpTransferIn,
	v1.ShardOpKind_SHARD_OP_KIND_WARM:         stock.OpWarm,
	v1.ShardOpKind_SHARD_OP_KIND_EXTEND:       stock.OpExtend,
	v1.ShardOpKind_SHARD_OP_KIND_REFUND:       stock.OpRefund,
}

// SaleFromProto converts a refund's original; nil is no sale.
func SaleFromProto(s *v1.Sale) stock.Sale {
	return stock.Sale{DeductKey: s.GetDeductKey(), ReservationID: s.GetReservationId()}
}

// SaleToProto converts a refund's original; nil for no sale.
func SaleToProto(s stock.Sale) *v1.Sale {
	switch {
	case s.DeductKey != "":
		return &v1.Sale{Sale: &v1.Sale_DeductKey{DeductKey: s.DeductKey}}
	case s.ReservationID != "":
		return &v1.Sale{Sale: &v1.Sale_ReservationId{ReservationId: s.ReservationID}}
	}
	return nil
}

// RequestFromProto converts a shard op to a domain request.
func RequestFromProto(op *v1.ShardOp) *stock.Request {
	return &stock.Request{
		Kind:          opKinds[op.GetKind()],
		Shard:         stock.ShardKey{SKU: op.GetSku(), Index: op.GetShard()},
		Quantity:      op.GetQuantity(),
		Key:           op.GetIdempotencyKey(),
		ReservationID: op.GetReservationId(),
		TransferID:    op.GetTransferId(),
		OrderRef:      op.GetOrderRef(),
		CustomerRef:   op.GetCustomerRef(),
		TTL:           durationOf(op.GetTtl()),
		Reason:        op.GetReason(),
		Approver:      op.GetApprover(),
		Source:        op.GetSource(),
		Caller:        op.GetCaller(),
		Original:      SaleFromProto(op.GetOriginal()),
	}
}

// RequestToProto converts a domain request to a shard op.
func RequestToProto(r *stock.Request) *v1.ShardOp {
	op := &v1.ShardOp{
		Sku: r.Shard.SKU, Shard: r.Shard.Index, Quantity: r.Quantity, IdempotencyKey: r.Key,
		ReservationId: r.ReservationID, TransferId: r.TransferID, OrderRef: r.OrderRef, CustomerRef: r.CustomerRef,
		Reason: r.Reason, Approver: r.Approver, Source: r.Source, Caller: r.Caller, Original: SaleToProto(r.Original),
	}
	for k, v := range opKinds {
		if v == r.Kind {
			op.Kind = k
		}
	}
	if r.TTL > 0 {
		op.Ttl = durationpb.New(r.TTL)
	}
	return op
}

func durationOf(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	if !d.IsValid() {
		return -1 // refused by validation
	}
	return d.AsDuration()
}

// DurationOf converts a proto duration; an invalid one becomes negative so
// that validation refuses it.
func DurationOf(d *durationpb.Duration) time.Duration { return durationOf(d) }

// ResultToProto converts a domain result.
func ResultToProto(r stock.Result) *v1.ShardResult {
	out := &v1.ShardResult{Replayed: r.Replayed, Available: r.Available}
	switch {
	case r.Err != nil:
		out.Result = &v1.ShardResult_Error{Error: &v1.ShardError{Reason: string(r.Err.Code), Message: r.Err.Message, Metadata: r.Err.Metadata}}
	case r.Transfer != nil:
		out.Result = &v1.ShardResult_Transfer{Transfer: TransferToProto(r.Transfer)}
	case r.Reservation != nil:
		out.Result = &v1.ShardResult_Reservation{Reservation: ReservationToProto(r.Reservation)}
	case r.Operation != nil:
		out.Result = &v1.ShardResult_Operation{Operation: OperationToProto(r.Operation)}
	case r.Warmed:
		out.Result = &v1.ShardResult_Warmed{Warmed: true}
	}
	return out
}

// ResultFromProto converts a shard result back to the domain.
func ResultFromProto(r *v1.ShardResult) stock.Result {
	out := stock.Result{Replayed: r.GetReplayed(), Available: r.GetAvailable()}
	switch x := r.GetResult().(type) {
	case *v1.ShardResult_Error:
		out.Err = &stock.Error{Code: stock.Code(x.Error.GetReason()), Message: x.Error.GetMessage(), Metadata: x.Error.GetMetadata()}
	case *v1.ShardResult_Reservation:
		out.Reservation = ReservationFromProto(x.Reservation)
	case *v1.ShardResult_Operation:
		out.Operation = OperationFromProto(x.Operation)
	case *v1.ShardResult_Transfer:
		out.Transfer = TransferFromProto(x.Transfer)
	case *v1.ShardResult_Warmed:
		out.Warmed = x.Warmed
	default:
		out.Err = stock.Errorf(stock.CodeInternal, "empty shard result")
	}
	return out
}

var resStates = map[stock.ReservationState]v1.ReservationState{
	stock.ReservationHeld:      v1.ReservationState_RESERVATION_STATE_HELD,
	stock.ReservationCommitted: v1.ReservationState_RESERVATION_STATE_COMMITTED,
	stock.ReservationReleased:  v1.ReservationState_RESERVATION_STATE_RELEASED,
	stock.ReservationExpired:   v1.ReservationState_RESERVATION_STATE_EXPIRED,
}

func resStateFromProto(s v1.ReservationState) stock.ReservationState {
	for k, v := range resStates {
		if v == s {
			return k
		}
	}
	return ""
}

var pubKinds = map[stock.OpKind]v1.OperationKind{
	stock.OpReserve:   v1.OperationKind_OPERATION_KIND_RESERVE,
	stock.OpDeduct:    v1.OperationKind_OPERATION_KIND_DEDUCT,
	stock.OpReplenish: v1.OperationKind_OPERATION_KIND_REPLENISH,
	stock.OpAdjust:    v1.OperationKind_OPERATION_KIND_ADJUST,
	stock.OpRefund:    v1.OperationKind_OPERATION_KIND_REFUND,
}

// ReservationToProto converts a reservation.
func ReservationToProto(r *stock.Reservation) *v1.Reservation {
	return &v1.Reservation{
		ReservationId: r.ID, Sku: r.SKU, Quantity: r.Quantity, State: resStates[r.State],
		ExpiresAt: timestamppb.New(r.ExpiresAt), Shard: r.Shard, OrderRef: r.OrderRef,
		IdempotencyKey: r.IdempotencyKey, CustomerRef: r.CustomerRef, CommittedQuantity: r.Committed,
	}
}

// ReservationFromProto converts a reservation back.
func ReservationFromProto(r *v1.Reservation) *stock.Reservation {
	return &stock.Reservation{
		ID: r.GetReservationId(), SKU: r.GetSku(), Quantity: r.GetQuantity(), State: resStateFromProto(r.GetState()),
		ExpiresAt: r.GetExpiresAt().AsTime(), Shard: r.GetShard(), OrderRef: r.GetOrderRef(),
		IdempotencyKey: r.GetIdempotencyKey(), CustomerRef: r.GetCustomerRef(), Committed: r.GetCommittedQuantity(),
	}
}

// OperationToProto converts an operation.
func OperationToProto(o *stock.Operation) *v1.Operation {
	return &v1.Operation{
		Sku: o.SKU, IdempotencyKey: o.IdempotencyKey, Kind: pubKinds[o.Kind], Quantity: o.Quantity, Shard: o.Shard,
		ReservationId: o.ReservationID, OrderRef: o.OrderRef, CustomerRef: o.CustomerRef,
		CreatedAt: timestamppb.New(o.CreatedAt), ReservationState: resStates[o.ReservationState],
		Original: SaleToProto(o.Original), OrderId: o.OrderID,
	}
}

// OperationFromProto converts an operation back.
func OperationFromProto(o *v1.Operation) *stock.Operation {
	out := &stock.Operation{
		SKU: o.GetSku(), IdempotencyKey: o.GetIdempotencyKey(), Quantity: o.GetQuantity(), Shard: o.GetShard(),
		ReservationID: o.GetReservationId(), OrderRef: o.GetOrderRef(), CustomerRef: o.GetCustomerRef(),
		CreatedAt: o.GetCreatedAt().AsTime(), ReservationState: resStateFromProto(o.GetReservationState()),
		Original: SaleFromProto(o.GetOriginal()), OrderID: o.GetOrderId(),
	}
	for k, v := range pubKinds {
		if v == o.GetKind() {
			out.Kind = k
		}
	}
	return out
}

var transferStates = map[stock.TransferState]v1.TransferState{
	stock.TransferPending:  v1.TransferState_TRANSFER_STATE_PENDING,
	stock.TransferDebited:  v1.TransferState_TRANSFER_STATE_DEBITED,
	stock.TransferCredited: v1.TransferState_TRANSFER_STATE_CREDITED,
	stock.TransferAborted:  v1.TransferState_TRANSFER_STATE_ABORTED,
	stock.TransferPlanned:  v1.TransferState_TRANSFER_STATE_PLANNED,
}

// TransferStateOf converts a transfer state back; ok is false for
// TRANSFER_STATE_UNSPECIFIED and for a value this build does not know.
func TransferStateOf(s v1.TransferState) (state stock.TransferState, ok bool) {
	for k, v := range transferStates {
		if v == s {
			return k, true
		}
	}
	return "", false
}

// TransferToProto converts a transfer. A planned transfer was never
// written and has no times: they are left out rather than sent as year 1.
func TransferToProto(t *stock.Transfer) *v1.Transfer {
	return &v1.Transfer{TransferId: t.ID, Sku: t.SKU, FromShard: t.From, ToShard: t.To, Quantity: t.Quantity,
		State: transferStates[t.State], CreatedAt: timestampOf(t.CreatedAt), FenceToken: t.FenceToken,
		Reason: t.Reason, UpdatedAt: timestampOf(t.UpdatedAt)}
}

// TransferFromProto converts a transfer back.
func TransferFromProto(t *v1.Transfer) *stock.Transfer {
	state, _ := TransferStateOf(t.GetState())
	return &stock.Transfer{ID: t.GetTransferId(), SKU: t.GetSku(), From: t.GetFromShard(), To: t.GetToShard(),
		Quantity: t.GetQuantity(), State: state, FenceToken: t.GetFenceToken(), Reason: t.GetReason(),
		CreatedAt: timeOf(t.GetCreatedAt()), UpdatedAt: timeOf(t.GetUpdatedAt())}
}

// MoveLeaseToProto converts a SKU's rebalance lease; nil (no one moves the
// SKU) stays nil.
func MoveLeaseToProto(l *stock.MoveLease) *v1.MoveLease {
	if l == nil {
		return nil
	}
	return &v1.MoveLease{Sku: l.SKU, Holder: l.Holder, Token: l.Token}
}

// MoveLeaseFromProto converts a rebalance lease back; nil stays nil.
func MoveLeaseFromProto(l *v1.MoveLease) *stock.MoveLease {
	if l == nil {
		return nil
	}
	return &stock.MoveLease{SKU: l.GetSku(), Holder: l.GetHolder(), Token: l.GetToken()}
}

// timestampOf converts a time; the zero time (never set) is left out.
func timestampOf(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// timeOf converts a timestamp back; an absent one is the zero time.
func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// LedgerEntryToProto converts a ledger entry.
func LedgerEntryToProto(e *stock.LedgerEntry) *v1.LedgerEntry {
	return &v1.LedgerEntry{
		Id: e.ID, Sku: e.Shard.SKU, Shard: e.Shard.Index, Kind: string(e.Kind), Quantity: e.Quantity,
		AvailableBefore: e.Before.Available, AvailableAfter: e.After.Available,
		ReservedBefore: e.Before.Reserved, ReservedAfter: e.After.Reserved,
		SoldBefore: e.Before.Sold, SoldAfter: e.After.Sold,
		IdempotencyKey: e.IdempotencyKey, ReservationId: e.ReservationID, TransferId: e.TransferID, OrderRef: e.OrderRef,
		Source: e.Source, Reason: e.Reason, Approver: e.Approver, ServerId: e.ServerID, Epoch: e.Epoch,
		CreatedAt: timestamppb.New(e.CreatedAt), Caller: e.Caller, Original: e.Original.ID(),
	}
}

var orderStates = map[stock.OrderState]v1.OrderState{
	stock.OrderPending:    v1.OrderState_ORDER_STATE_PENDING,
	stock.OrderHeld:       v1.OrderState_ORDER_STATE_HELD,
	stock.OrderCommitting: v1.OrderState_ORDER_STATE_COMMITTING,
	stock.OrderCommitted:  v1.OrderState_ORDER_STATE_COMMITTED,
	stock.OrderReleasing:  v1.OrderState_ORDER_STATE_RELEASING,
	stock.OrderReleased:   v1.OrderState_ORDER_STATE_RELEASED,
	stock.OrderFailed:     v1.OrderState_ORDER_STATE_FAILED,
}

// OrderToProto converts an order.
func OrderToProto(o *stock.Order) *v1.Order {
	out := &v1.Order{OrderId: o.ID, OrderRef: o.OrderRef, State: orderStates[o.State], IdempotencyKey: o.IdempotencyKey,
		CustomerRef: o.CustomerRef, Reason: o.Reason}
	if !o.ExpiresAt.IsZero() {
		out.ExpiresAt = timestamppb.New(o.ExpiresAt)
	}
	for _, l := range o.Lines {
		out.Lines = append(out.Lines, &v1.OrderLine{Sku: l.SKU, Quantity: l.Quantity, ReservationId: l.ReservationID})
	}
	return out
}
