package stock

import (
	"errors"
	"time"
)

// The contract between a shard server's writers and their storage: what a
// batch reads, what it decides to write, and how it can fail. The planner
// (internal/shard) works on these types alone; internal/postgres carries
// them out in one transaction per group of batches.

// Errors of a batch transaction. Every one but ErrOutcomeUnknown means the
// batch wrote nothing.
var (
	// ErrFenced: the partition's epoch in the database is not the writer's:
	// another server took the partition over.
	ErrFenced = errors.New("stock: fenced: partition owned at another epoch")
	// ErrConflict: another shard's batch took a key or a customer's quota
	// concurrently; rerun the batch (the lookups will see it).
	ErrConflict = errors.New("stock: conflict with a concurrent batch")
	// ErrDiverged: the shard row is not what the writer's memory says: an
	// invariant violation (a second writer).
	ErrDiverged = errors.New("stock: shard row diverged from the writer's copy")
	// ErrNotCommitted: the transaction failed before or at commit and is
	// known not to have committed.
	ErrNotCommitted = errors.New("stock: batch not committed")
	// ErrOutcomeUnknown: the commit's outcome could not be learnt.
	ErrOutcomeUnknown = errors.New("stock: batch commit outcome unknown")
)

// Fence identifies a writer: the partition it writes, the epoch it owns it
// at, and its server.
type Fence struct {
	Partition int32
	Epoch     int64
	ServerID  string
}

// BatchQuery says what a batch must read before it decides.
type BatchQuery struct {
	Shard          ShardKey
	Keys           []string // idempotency keys of keyed requests, all of the shard's SKU
	ReservationIDs []string // reservations committed or released
	Customers      []string // customer refs of reserves and deducts
	SweepMax       int      // >0: also read up to this many due holds
	TransferIDs    []string // transfers stepped
	// LoadShard: also read the shard's row, for a writer that has no copy
	// of it yet (a cold shard's first batch costs no query of its own).
	// The read then also returns the SKU's other shards (BatchRead.Siblings),
	// so that their writers, when they start, need not read theirs.
	LoadShard bool
	// Seeded: the writer's copy of the row is a sibling's read (a seed),
	// not one of its own. Storage may decide from it only in a speculative
	// group, whose write compares the row; a group that runs with its reads
	// reads the row instead, as for LoadShard.
	Seeded bool
	// KnownSKU is the SKU as the writer last read it (nil: not yet). With
	// it, storage may decide a batch that needs no read but its keys'
	// before reading anything, assuming every key new and the SKU and the
	// fence unchanged, and check all three in the write itself; when one
	// does not hold, nothing is written and the batch is decided again
	// from what storage reads. Decide must therefore not depend on being
	// called once.
	KnownSKU *SKU
	// Sales are the sales (Sale.ID) whose refunds the batch's refunds
	// count: their Refunded is read.
	Sales []string
	// Orders are the (order_ref, kind) pairs of the batch's reserves and
	// deducts that name an order (OrderApplied.Name): on a SKU with
	// OnePerOrder, the first key that applied each is read.
	Orders []string
	// Extending: the batch extends a reservation, which needs the
	// reservation as stored (when it was made); it is never speculated.
	Extending bool
	// KnownHeld has every reservation of ReservationIDs as the writer
	// knows it: held (the writer made it, and has not ended it since); nil
	// when the writer does not know them all. With KnownSKU, storage may
	// decide commits and releases from it before reading, as for keys: the
	// write ends each only if it is still held, else nothing is written and
	// the batch is decided again from what storage reads.
	KnownHeld map[string]*Reservation
}

// BatchRead is what the batch read, inside its transaction.
type BatchRead struct {
	SKU *SKU // nil: no such SKU
	// Ops are the SKU's recorded operations of the query's keys, by key:
	// an operation is identified by (sku, idempotency_key), so the same
	// key on another SKU is not here.
	Ops          map[string]*Operation
	Reservations map[string]*Reservation
	Due          []*Reservation    // held and expired, for the sweep
	Usage        map[string]int64  // customer ref -> units held or bought
	Refunded     map[string]int64  // sale (Sale.ID) -> units refunded, of the query's Sales
	Applied      map[string]string // OrderApplied.Name -> the first key that applied it, of the query's Orders
	Transfers    map[string]*Transfer
	// MoveFences are the move fences of the SKUs of Transfers: a pending
	// transfer whose token is below its SKU's fence is aborted, not debited.
	MoveFences map[string]int64
	Now        time.Time // the database clock
	// ShardRead: the shard's row was read (the query asked: LoadShard, or
	// Seeded in a group that ran with its reads). Counts is then the row as
	// read under the fence; nil means the shard does not exist.
	ShardRead bool
	Counts    *Counts
	// HaltReason is why the loaded shard is halted ("" if it is not): its
	// writer must refuse every write (see CheckShard).
	HaltReason string
	// Siblings are the other shards of the SKU that are not halted, as read
	// with this one's row (ShardRead): seeds for their writers.
	Siblings []ShardRow
}

// BatchWrite is what the batch decided to write.
type BatchWrite struct {
	Ops             []*Operation
	NewReservations []*Reservation
	Ended           []ReservationEnd
	UsageAdd        map[string]int64 // customer -> units (guarded by Limit)
	UsageSub        map[string]int64 // customer -> units given back
	UsageLimit      int64
	Ledger          []*LedgerEntry
	Steps           []TransferStep
	// Extended moves held reservations' expiry later.
	Extended []ReservationExtend
	// Refunds add to their sales' refunded units, each guarded by what
	// the sale sold (a refund of it on another shard may race this one).
	Refunds []RefundAdd
	// Applied records the first key of each (order_ref, kind) on a SKU
	// with OnePerOrder; another key's is a conflict in storage.
	Applied  []OrderApplied
	From, To Counts
	// Checkpoint asks for a checkpoint of the shard after the write's last
	// ledger entry: its running balance, so that the books are read from
	// there on (internal/ledger).
	Checkpoint Checkpointing
}

// Checkpointing says whether a write makes a checkpoint of its shard.
type Checkpointing int8

// Checkpointings.
const (
	// CheckpointNone: fewer entries than enough since the last.
	CheckpointNone Checkpointing = iota
	// CheckpointAlways: the writer counted enough entries since the last.
	CheckpointAlways
	// CheckpointIfDue: the writer does not know how many there are (it
	// is new): the database counts them, up to as many as are enough.
	CheckpointIfDue
)

// TransferStep moves one transfer from one state to the next.
type TransferStep struct {
	ID       string
	From, To TransferState
}

// ReservationEnd ends one held reservation.
type ReservationEnd struct {
	ID     string
	State  ReservationState
	Reason string
	// Committed is the units bought (a commit; the rest was released).
	Committed int64
}

// ReservationExtend moves a held reservation's expiry.
type ReservationExtend struct {
	ID        string
	ExpiresAt time.Time
}

// OrderApplied is the first key that applied an order_ref for a kind.
type OrderApplied struct {
	SKU, OrderRef string
	Kind          OpKind
	Key           string
}

// OrderName names an (order_ref, kind) pair in BatchQuery.Orders.
func OrderName(orderRef string, kind OpKind) string { return string(kind) + ":" + orderRef }

// RefundAdd adds Quantity to a sale's refunded units, which must stay at
// most Sold.
type RefundAdd struct {
	SKU      string
	Sale     string // Sale.ID
	Sold     int64
	Quantity int64
}

// Empty reports whether the write changes nothing.
func (w *BatchWrite) Empty() bool {
	return len(w.Ops) == 0 && len(w.NewReservations) == 0 && len(w.Ended) == 0 && len(w.Ledger) == 0 &&
		len(w.Steps) == 0 && len(w.UsageAdd) == 0 && len(w.UsageSub) == 0 && len(w.Extended) == 0 &&
		len(w.Refunds) == 0 && len(w.Applied) == 0 && w.From == w.To
}

// Decide turns what a batch read into what it writes. It runs inside the
// transaction and must be pure: it may run again on a retry.
type Decide func(*BatchRead) (*BatchWrite, error)

// Unit is one shard's batch within a group transaction: its writer's
// fence, what it must read, and how it decides. Err is set for a unit that
// was left out of the group's writes (fenced).
type Unit struct {
	Fence  Fence
	Query  BatchQuery
	Decide Decide
	Err    error
}

// SKUUpdate changes some of a SKU's settings; nil fields stay.
type SKUUpdate struct {
	Paused        *bool
	MaxPerOrder   *int64
	CustomerLimit *int64
	TTL           *time.Duration
	AutoShards    *bool
	// SaleStart and SaleEnd set a bound of the sale window; nil keeps it.
	// ClearSaleWindow removes both (with neither set).
	SaleStart, SaleEnd *time.Time
	ClearSaleWindow    bool
	MaxHold            *time.Duration
	OnePerOrder        *bool
	// Admission replaces the SKU's admission; nil keeps it.
	Admission *Admission
}

// StaleStep is a transfer step a shard server should finish: a pending
// transfer to debit (on its source) or a debited one to credit (on its
// destination).
type StaleStep struct {
	Kind     OpKind
	Shard    ShardKey
	Transfer string
}

// ShardRow is one shard's counts as stored.
type ShardRow struct {
	Index int32
	Counts
	// HaltReason is why the shard is halted; "" if it is not.
	HaltReason string
	// Retiring: the shard is out of service (its index is at or above the
	// SKU's Shards) but may still hold stock or reservations.
	Retiring bool
}

// StockRead is what GetStock shows of a SKU, read in one database
// snapshot, so that its counts add up even while transfers step.
type StockRead struct {
	Shards    []ShardRow // in its span, by index
	Totals    Counts     // over every shard, retired ones included
	InTransit int64      // debited, not yet credited
	Moving    []*Transfer
}

// ShardCheck is a shard's row beside what its ledger says the row must be:
// its latest checkpoint (or its opening balance) plus the deltas of the
// entries after it.
type ShardCheck struct {
	Row    Counts
	Ledger Counts
	// HaltReason is why the shard is halted; "" if it is not.
	HaltReason string
}

// Consistent reports whether the row is what the ledger sums to.
func (c ShardCheck) Consistent() bool { return c.Row == c.Ledger }

// LostCommits counts the commits whose answer was lost, by what their
// outcome turned out to be.
type LostCommits struct {
	Committed int64 // the batch had committed
	Voided    int64 // it had not, and its mark was voided
	Unknown   int64 // the database did not answer within outcomeWaitMax
}
