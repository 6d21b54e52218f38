// Package stock holds shardstock's domain: SKUs, shards, operations,
// reservations, ledger-entry kinds, the limits on every input and the error
// codes. It imports nothing from Postgres, Connect or etcd.
package stock

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
)

// Limits on every input, enforced before anything is written.
const (
	SKULenMax            = 64
	IdempotencyKeyLenMax = 128
	RefLenMax            = 128 // order_ref, customer_ref
	ReasonLenMax         = 256
	ApproverLenMax       = 64
	// CallerLenMax bounds Request.Caller: a role, "jwt:" and a subject
	// of up to RefLenMax.
	CallerLenMax          = 16 + RefLenMax
	QuantityMax           = 1_000_000
	StockMax              = 1_000_000_000_000 // initial stock, adjustments
	ShardsMax             = 256
	ReservationTTLMin     = time.Second
	ReservationTTLMax     = 24 * time.Hour
	ReservationTTLDefault = 15 * time.Minute
	// MaxHoldDefault is how long a reservation may be held in all, however
	// often it is extended, on a SKU that sets no max_hold; MaxHoldMax is
	// the most a SKU may set.
	MaxHoldDefault = 24 * time.Hour
	MaxHoldMax     = 7 * 24 * time.Hour
)

// ShardCountMax is the most units one shard may hold, available plus
// reserved. A replenish or adjustment that would take a shard past it is
// refused INVALID_QUANTITY before anything is written, and no transfer is
// created that would take its destination past it; a shard that holds
// more already (a row older than the ceiling) takes nothing more in. Why
// 10^15: it is 1,000 times StockMax, the most one adjustment or a new SKU
// may bring, so honest stock never comes near it; and 3 counts of
// ShardsMax shards at 10^15 (7.7·10^17) stay far below 2^63 (9.2·10^18), so
// neither a shard's counts nor a SKU's totals can wrap an int64, which
// would otherwise be caught only by halting the shard. Sold is not held:
// it rises only by units first held, at most QuantityMax a request, so it
// needs over 9·10^12 requests on one shard to wrap.
const ShardCountMax = 1_000_000_000_000_000

// Room returns how many more units a shard of counts c may take in before
// it holds ShardCountMax; negative when it holds more already.
func (c Counts) Room() int64 { return ShardCountMax - c.Available - c.Reserved }

// Partitions is the fixed number of fencing partitions. Shard servers own
// partitions, not SKUs, so a million SKUs need only this many etcd keys.
const Partitions = 256

// PartitionOf maps a shard to its partition by hash of sku and index.
func PartitionOf(sku string, index int32) int32 {
	h := fnv.New32a()
	h.Write([]byte(sku))
	h.Write([]byte{0, byte(index >> 24), byte(index >> 16), byte(index >> 8), byte(index)})
	return int32(h.Sum32() % Partitions)
}

// ShardKey names one shard.
type ShardKey struct {
	SKU   string
	Index int32
}

func (k ShardKey) String() string { return fmt.Sprintf("%s#%d", k.SKU, k.Index) }

// Partition is the shard's fencing partition.
func (k ShardKey) Partition() int32 { return PartitionOf(k.SKU, k.Index) }

// Counts are one shard's (or a SKU's) stock counts.
type Counts struct {
	Available int64
	Reserved  int64
	Sold      int64
}

// Valid reports whether no count is negative (invariant 1).
func (c Counts) Valid() bool { return c.Available >= 0 && c.Reserved >= 0 && c.Sold >= 0 }

// Add returns c + d.
func (c Counts) Add(d Counts) Counts {
	return Counts{c.Available + d.Available, c.Reserved + d.Reserved, c.Sold + d.Sold}
}

// Status is a SKU's selling status.
type Status string

const (
	StatusActive Status = "active"
	StatusPaused Status = "paused"
)

// SKU is a SKU's configuration.
type SKU struct {
	Name   string
	Status Status
	// Shards is the number of shards in service, 0..Shards-1: the ones that
	// take new reserves and deducts.
	Shards int32
	// ShardSpan is the number of shards that may hold stock: the shards in
	// service plus those being retired after SetShards made the SKU
	// smaller (Shards..ShardSpan-1). Equal to Shards once they retired.
	ShardSpan int32
	// AutoShards: the rebalancer may split the SKU when hot and merge it
	// back when cold (UpdateSku; on for a new SKU).
	AutoShards     bool
	MaxPerOrder    int64 // 0: no limit
	CustomerLimit  int64 // 0: no limit
	ReservationTTL time.Duration
	// SaleStart and SaleEnd bound the sale window (zero: no bound):
	// reserves and deducts are refused before SaleStart and from SaleEnd
	// on, by the database's clock (SKU.Window).
	SaleStart, SaleEnd time.Time
	// MaxHold is the longest a reservation may be held from when it was
	// made, however often it is extended (ExtendReservation).
	MaxHold time.Duration
	// OnePerOrder: an order_ref is applied at most once per kind (deduct,
	// reserve, refund): another key with the same order_ref is refused
	// ORDER_ALREADY_APPLIED.
	OnePerOrder bool
	// Admission: when on, the SKU sells only through purchase tokens
	// (docs/admission.md); a plain reserve or deduct is refused
	// TOKEN_REQUIRED.
	Admission Admission
	// Version is the row's version in storage, drawn anew (at random) at
	// every change of it: two reads with the same version read the same
	// settings. 0: not read from storage, or a row from before migration
	// 00023 that 00024 has not reached yet: nothing to check a read by.
	Version int64
}

// OpKind is the kind of a shard operation.
type OpKind string

const (
	OpReserve   OpKind = "reserve"
	OpCommit    OpKind = "commit"
	OpRelease   OpKind = "release"
	OpDeduct    OpKind = "deduct"
	OpReplenish OpKind = "replenish"
	OpAdjust    OpKind = "adjust"
	OpExpire    OpKind = "expire"
	// OpTransferOut and OpTransferIn are the two steps of a transfer.
	OpTransferOut OpKind = "transfer_out"
	OpTransferIn  OpKind = "transfer_in"
	// OpWarm starts a shard's writer with its row loaded
	// (AdminService.Prewarm); it changes nothing and is not ledgered.
	OpWarm OpKind = "warm"
	// OpExtend moves a held reservation's expiry later; it moves no count.
	OpExtend OpKind = "extend"
	// OpRefund gives back units of a sale: sold back to available.
	OpRefund OpKind = "refund"
)

// Keyed reports whether the kind is idempotent by (sku, idempotency_key);
// commit, release and extend are idempotent by reservation id instead.
func (k OpKind) Keyed() bool {
	return k == OpReserve || k == OpDeduct || k == OpReplenish || k == OpAdjust || k == OpRefund
}

// Delta is how a kind of operation moves a shard's counts for quantity q.
func (k OpKind) Delta(q int64) Counts {
	switch k {
	case OpReserve:
		return Counts{Available: -q, Reserved: q}
	case OpCommit:
		return Counts{Reserved: -q, Sold: q}
	case OpRelease, OpExpire:
		return Counts{Available: q, Reserved: -q}
	case OpDeduct:
		return Counts{Available: -q, Sold: q}
	case OpReplenish, OpAdjust, OpTransferIn:
		return Counts{Available: q}
	case OpTransferOut:
		return Counts{Available: -q}
	case OpRefund:
		return Counts{Available: q, Sold: -q}
	}
	return Counts{}
}

// ReservationState is where a reservation is in its life.
type ReservationState string

const (
	ReservationHeld      ReservationState = "held"
	ReservationCommitted ReservationState = "committed"
	ReservationReleased  ReservationState = "released"
	ReservationExpired   ReservationState = "expired"
)

// Reservation is a hold on one shard's stock.
type Reservation struct {
	ID             string
	SKU            string
	Shard          int32
	Quantity       int64
	State          ReservationState
	ExpiresAt      time.Time
	OrderRef       string
	CustomerRef    string
	IdempotencyKey string
	// Committed is the units bought once committed: fewer than Quantity
	// after a partial commit, which released the rest.
	Committed int64
	// CreatedAt is when the reservation was made: MaxHold counts from it.
	CreatedAt time.Time
}

// Sale names a sale that a refund reverses: a deduct by its key, or a
// committed reservation by its id. Exactly one is set.
type Sale struct {
	DeductKey     string
	ReservationID string
}

// ID is the sale's name in the books ("deduct:KEY", "reservation:ID"),
// under which its refunds are counted; "" for no sale.
func (s Sale) ID() string {
	switch {
	case s.DeductKey != "":
		return "deduct:" + s.DeductKey
	case s.ReservationID != "":
		return "reservation:" + s.ReservationID
	}
	return ""
}

// ParseSale is the Sale that ID returned id for.
func ParseSale(id string) Sale {
	if k, ok := strings.CutPrefix(id, "deduct:"); ok {
		return Sale{DeductKey: k}
	}
	if r, ok := strings.CutPrefix(id, "reservation:"); ok {
		return Sale{ReservationID: r}
	}
	return Sale{}
}

// Operation is the recorded first result of a keyed action.
type Operation struct {
	SKU            string
	IdempotencyKey string
	Kind           OpKind
	Quantity       int64
	Shard          int32
	ParamsHash     []byte
	ReservationID  string
	OrderRef       string
	CustomerRef    string
	CreatedAt      time.Time
	// ReservationState is the reservation's current state (reserve only).
	ReservationState ReservationState
	// ReservationExpiresAt is the reservation's expiry (reserve only).
	ReservationExpiresAt time.Time
	// Original is the sale a refund reverses (refund only).
	Original Sale
	// OrderID is the order whose line this reserve is (order lines only,
	// once the order records the line; filled in by the allocator).
	OrderID string
}

// Source values for the ledger.
const (
	SourceAPI         = "api"
	SourceSweeper     = "sweeper"
	SourceAllocator   = "allocator"
	SourceRebalancer  = "rebalancer"
	SourceAdminPrefix = "admin:"
)

// Request is one operation on one shard, as a shard server's writer takes it.
type Request struct {
	Kind          OpKind
	Shard         ShardKey
	Quantity      int64
	Key           string // keyed kinds
	ReservationID string // commit, release
	TransferID    string // transfer_out, transfer_in
	OrderRef      string
	CustomerRef   string
	TTL           time.Duration // reserve; 0 means the SKU's default
	Reason        string
	Approver      string
	Source        string
	// Caller names who asked, for the ledger: a role and a credential id
	// (never a secret), e.g. "service:token:3f2a9c1b0d4e"; empty for the
	// shardstock's own work (sweeps, moves).
	Caller string
	// Original is the sale a refund reverses.
	Original Sale
}

// Result is the answer to one Request.
type Result struct {
	Operation   *Operation
	Reservation *Reservation
	Transfer    *Transfer
	Replayed    bool
	Err         *Error
	// Warmed answers OpWarm: the shard's writer runs with its row loaded.
	Warmed bool
	// Available is the shard's available stock after the batch: a hint for
	// routing.
	Available int64
}

// ErrResult is the answer of a request that failed with err: err itself
// when it is an *Error, else fallback (what the caller may tell a client of
// a failure it cannot name: a retry, or an internal error).
func ErrResult(err error, fallback *Error) Result {
	if e, ok := errors.AsType[*Error](err); ok {
		return Result{Err: e}
	}
	return Result{Err: fallback}
}

// LedgerEntry is one change to one shard's counts.
type LedgerEntry struct {
	ID             int64
	Shard          ShardKey
	Kind           OpKind
	Quantity       int64
	Before, After  Counts
	IdempotencyKey string // the operation's key (reserve's key for commit, release, expire)
	ReservationID  string
	TransferID     string
	OrderRef       string
	// Original is the sale a refund entry reverses ("" for other kinds).
	Original  Sale
	Source    string
	Caller    string // Request.Caller
	Reason    string
	Approver  string
	ServerID  string
	Epoch     int64
	CreatedAt time.Time
}

// TransferState is where a two-phase transfer is.
type TransferState string

const (
	TransferPending  TransferState = "pending"
	TransferDebited  TransferState = "debited"
	TransferCredited TransferState = "credited"
	TransferAborted  TransferState = "aborted"
	// TransferPlanned is a move of a dry-run plan: nothing was written.
	TransferPlanned TransferState = "planned"
)

// Open reports whether a transfer has steps left.
func (s TransferState) Open() bool { return s == TransferPending || s == TransferDebited }

// TransferFilter selects transfers; zero fields select all.
type TransferFilter struct {
	SKU   string
	State TransferState
}

// MoveLease is a SKU's rebalance lease: present only while the SKU is being
// moved. Token is the etcd key's revision, recorded on every transfer the
// holder creates and checked by the source shard's writer.
type MoveLease struct {
	SKU    string
	Holder string
	Token  int64
}

// Transfer moves available stock from one shard of a SKU to another.
// TransferCursor is a place in the transfers ordered by creation: after
// the transfer ID created at CreatedAt.
type TransferCursor struct {
	CreatedAt time.Time
	ID        string
}

// Before reports whether c comes before d.
func (c TransferCursor) Before(d TransferCursor) bool {
	if !c.CreatedAt.Equal(d.CreatedAt) {
		return c.CreatedAt.Before(d.CreatedAt)
	}
	return c.ID < d.ID
}

type Transfer struct {
	ID         string
	SKU        string
	From, To   int32
	Quantity   int64
	State      TransferState
	FenceToken int64
	Reason     string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Refuse returns why the SKU refuses a reserve or deduct before its stock is
// looked at, or nil: paused, outside its sale window at now, above
// max_per_order, without a customer_ref under a customer_limit (a limit a
// request could dodge by naming no customer is no limit), or taking the
// customer (who holds usage units already) past customer_limit. The shard
// planner and the allocator's sold-out answers both decide by it. now is
// the database's clock; zero when the caller has none, and then the window
// is not looked at: only a batch transaction's clock decides it, so that no
// process's clock can sell outside the window or refuse inside it.
func (s *SKU) Refuse(r *Request, usage int64, now time.Time) *Error {
	if r.Kind != OpReserve && r.Kind != OpDeduct {
		return nil
	}
	if s.Status == StatusPaused {
		return Errorf(CodeSKUPaused, "sku %q is paused", s.Name)
	}
	if s.Admission.On() && r.Source != SourceAdmission {
		return Errorf(CodeTokenRequired, "sku %q sells only through tokens: ask RequestToken", s.Name)
	}
	if err := s.Window(now); err != nil {
		return err
	}
	switch {
	case s.MaxPerOrder > 0 && r.Quantity > s.MaxPerOrder:
		return Errorf(CodeQuantityAboveMaxPerOrder, "quantity is above the sku's max_per_order")
	case s.CustomerLimit > 0 && r.CustomerRef == "":
		return Errorf(CodeCustomerRefRequired, "sku %q has a customer_limit: customer_ref is required", s.Name)
	case s.CustomerLimit > 0 && usage+r.Quantity > s.CustomerLimit:
		return Errorf(CodeCustomerLimitReached, "customer %q reached the sku's customer_limit", r.CustomerRef)
	}
	return nil
}

// Metadata keys of the sale window's refusals (ErrorInfo metadata), each an
// RFC 3339 time with nanoseconds.
const (
	MetaSaleStart = "sale_start"
	MetaSaleEnd   = "sale_end"
)

// Window returns SALE_NOT_STARTED before the SKU's sale window opens and
// SALE_ENDED once it has closed, at now (the database's clock), each with
// its bound in the error's metadata; nil inside the window, when the SKU
// has none, or when now is zero (not known).
func (s *SKU) Window(now time.Time) *Error {
	switch {
	case now.IsZero():
		return nil
	case !s.SaleStart.IsZero() && now.Before(s.SaleStart):
		e := Errorf(CodeSaleNotStarted, "the sale of sku %q starts at %s", s.Name, s.SaleStart.UTC().Format(time.RFC3339Nano))
		e.Metadata = map[string]string{MetaSaleStart: s.SaleStart.UTC().Format(time.RFC3339Nano)}
		return e
	case !s.SaleEnd.IsZero() && !now.Before(s.SaleEnd):
		e := Errorf(CodeSaleEnded, "the sale of sku %q ended at %s", s.Name, s.SaleEnd.UTC().Format(time.RFC3339Nano))
		e.Metadata = map[string]string{MetaSaleEnd: s.SaleEnd.UTC().Format(time.RFC3339Nano)}
		return e
	}
	return nil
}

// HasWindow reports whether the SKU has a sale window bound.
func (s *SKU) HasWindow() bool { return !s.SaleStart.IsZero() || !s.SaleEnd.IsZero() }

// Stock is a SKU's counts and its shards.
type Stock struct {
	SKU       *SKU
	Total     Counts
	InTransit int64
	// Shards are the shards in service, then those still being retired.
	Shards []ShardStock
	// Moving are the SKU's transfers in flight (pending or debited).
	Moving []*Transfer
	// Mover is the holder of the SKU's rebalance lease; nil when no one is
	// moving the SKU.
	Mover *MoveLease
}

// ShardStock is one shard's counts and owner.
type ShardStock struct {
	Index    int32
	ServerID string
	Counts
	// HaltReason is why the shard is halted; "" while it serves.
	HaltReason string
	// Retiring: the shard is out of service after SetShards made the SKU
	// smaller, and is retired once its stock has moved and its
	// reservations have ended.
	Retiring bool
}

// SKUFilter selects SKUs for a listing; zero fields select all.
type SKUFilter struct {
	Prefix string
	Status Status
}

// SKUSummary is a SKU's configuration and its counts summed over its
// shards, as a listing shows it.
type SKUSummary struct {
	SKU *SKU
	// Database is the database that holds the SKU.
	Database  string
	Total     Counts
	InTransit int64
}

// SKUNameAfterMax is an upper bound on every SKU name that starts with a
// prefix, in byte order: prefix followed by the byte after the last one
// ValidateSKU allows ('z').
func SKUNameAfterMax(prefix string) string { return prefix + "{" }
