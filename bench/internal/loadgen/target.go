// Package loadgen drives a stock system under test (a Target) with the source
// document's traffic models and fault modes, measures what the clients saw
// (counts, latency, throughput) and ends every run with a reconciliation: it
// reads the target's final state and computes the correctness line (oversold,
// undersold, duplicate deductions, reconciliation differences) from what the
// clients observed plus that state.
//
// A Target is one request per call: the runner measures latency around each
// call and decides retries, duplicates and abandonment itself, so every
// Target (shardstock over Connect, the Postgres and Redis baselines, an
// in-process fake) is driven by exactly the same client.
package loadgen

import (
	"context"
	"sort"
	"strconv"
	"strings"

	"github.com/shardstock/shardstock/internal/stock"
)

// Target is a system under test.
type Target interface {
	// Name is the short name used in tables and reports.
	Name() string
	// Setup creates the SKUs with their stock (and for shardstock, shards per
	// SKU), empty state.
	Setup(ctx context.Context, skus []SKUSpec) error
	// Deduct, Reserve, Commit and Release send one request each; the Outcome
	// classifies the answer. Latency is measured by the runner.
	Deduct(ctx context.Context, sku, key string, qty int64) Outcome
	Reserve(ctx context.Context, sku, key string, qty int64) (reservationID string, o Outcome)
	Commit(ctx context.Context, reservationID string) Outcome
	Release(ctx context.Context, reservationID string) Outcome
	// Verify reads the final state of every SKU: counts, ledger entries per
	// kind, distinct successful keys in the system's own records and the
	// system's own reconciliation differences.
	Verify(ctx context.Context, skus []SKUSpec) (State, error)
	// Close releases what Setup created (schemas, keys, connections).
	Close() error
}

// Baseline is implemented by targets measured only for comparison: their
// correctness is reported as it is and does not fail a run.
type Baseline interface {
	Baseline() bool
}

// IsBaseline reports whether t is a baseline.
func IsBaseline(t Target) bool {
	b, ok := t.(Baseline)
	return ok && b.Baseline()
}

// SKUSpec is one SKU of a run.
type SKUSpec struct {
	SKU    string
	Stock  int64
	Shards int32
}

// Status classifies one answer.
type Status uint8

// Statuses of an answer.
const (
	StatusOK         Status = iota + 1 // the request changed stock
	StatusReplayed                     // a retry: the first result, nothing changed
	StatusOutOfStock                   // refused for stock; nothing changed
	StatusError                        // anything else; see Outcome.Code
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusReplayed:
		return "replayed"
	case StatusOutOfStock:
		return "out-of-stock"
	case StatusError:
		return "error"
	}
	return "unknown"
}

// Outcome is a target's answer to one request.
type Outcome struct {
	Status Status
	// Code names the error when Status is StatusError: a domain code of
	// internal/stock (e.g. RESERVATION_ALREADY_RELEASED) or a transport code
	// such as CANCELED or DEADLINE_EXCEEDED.
	Code string
	// Detail is the error's message, if the target has one: the table
	// shows one per code, to tell why.
	Detail string
}

// The outcomes without a code.
var (
	OK         = Outcome{Status: StatusOK}
	Replayed   = Outcome{Status: StatusReplayed}
	OutOfStock = Outcome{Status: StatusOutOfStock}
)

// Error returns an error outcome with the code.
func Error(code string) Outcome { return Outcome{Status: StatusError, Code: code} }

// Transport and client codes, beside the domain codes of internal/stock.
const (
	CodeCanceled         = "CANCELED"
	CodeDeadlineExceeded = "DEADLINE_EXCEEDED"
	CodeUnavailable      = "UNAVAILABLE"
	CodeUnknown          = "UNKNOWN"
	// CodeAbandoned is set by the runner on an attempt that it cancelled on
	// purpose (the abandon fault mode), whatever the target answered.
	CodeAbandoned = "ABANDONED"
)

// ErrorFromContext returns the outcome for a request that failed because ctx
// ended, or false if ctx is still live.
func ErrorFromContext(ctx context.Context) (Outcome, bool) {
	switch ctx.Err() {
	case nil:
		return Outcome{}, false
	case context.DeadlineExceeded:
		return Error(CodeDeadlineExceeded), true
	default:
		return Error(CodeCanceled), true
	}
}

// Definite reports whether the outcome tells for certain what happened: a
// success, a replay, a refusal for stock, or an error whose code says it
// changed nothing (stock.Code.Definite; a transport's code never does).
func (o Outcome) Definite() bool {
	switch o.Status {
	case StatusOK, StatusReplayed, StatusOutOfStock:
		return true
	case StatusError:
		return stock.Code(o.Code).Definite()
	}
	return false
}

// retryable reports whether a client that wants a definite answer should send
// the same request again.
func (o Outcome) retryable() bool {
	return !o.Definite() || stock.Code(o.Code).Retryable()
}

func (o Outcome) String() string {
	if o.Status == StatusError {
		return "error " + o.Code
	}
	return o.Status.String()
}

// State is a target's final state, as read by Verify.
type State struct {
	SKUs map[string]SKUState
}

// SKUState is one SKU's final state.
type SKUState struct {
	Available int64
	Reserved  int64
	Sold      int64
	InTransit int64
	// Replenished is the net stock added after Setup (replenishments and
	// adjustments), which the oversold formula allows.
	Replenished int64
	// Ledger counts the ledger entries per kind ("deduct", "reserve",
	// "commit", "release", ...).
	Ledger map[string]int64
	// Operations counts the stock-taking applications (deducts and reserves)
	// in the system's own records; more than DistinctKeys means a key was
	// applied twice.
	Operations int64
	// DistinctKeys counts the distinct idempotency keys with a successful
	// deduct or reserve in the system's own records.
	DistinctKeys int64
	// ExtraEnds counts end records (commit, release, expire) beyond one per
	// reservation in the system's own records: a reservation ended twice.
	ExtraEnds int64
	// Discrepancies are the system's own reconciliation differences
	// (shardstock: AdminService.Reconcile; baselines: ledger against rows).
	Discrepancies []Discrepancy
	// Keys is the system's own record of the SKU's deducts and reserves, by
	// idempotency key, and Reservations of its reservations, by id: what
	// the per-operation check of acknowledged answers looks each one up
	// in. Both nil: the target cannot tell (the baselines), and that check
	// is skipped.
	Keys         map[string]KeyRecord
	Reservations map[string]ReservationRecord
	// Refunded is the units refunded per sale, by the sale's name in the
	// system's refund records (SaleOfReservation, or "deduct:KEY"); nil
	// when the target has no refunds.
	Refunded map[string]int64
}

// KeyRecord is what the system recorded of one idempotency key.
type KeyRecord struct {
	Kind string // "deduct" or "reserve" (stock.OpDeduct, stock.OpReserve)
	// Applied counts the key's applications (ledger entries): exactly one
	// for a key that succeeded.
	Applied int64
	// ReservationID is the reservation a reserve key created.
	ReservationID string
}

// ReservationRecord is what the system recorded of one reservation: how
// many times each end applied to it. None: it is still held.
type ReservationRecord struct {
	Committed, Released, Expired int64
}

// Ends counts the reservation's end records.
func (r ReservationRecord) Ends() int64 { return r.Committed + r.Released + r.Expired }

// Discrepancy is one reconciliation difference.
type Discrepancy struct {
	Check    string
	Shard    int32
	Detail   string
	Expected int64
	Actual   int64
}

// LedgerString formats ledger counts as "commit=3 deduct=5", sorted by kind.
func (s SKUState) LedgerString() string {
	kinds := make([]string, 0, len(s.Ledger))
	for k := range s.Ledger {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	for i, k := range kinds {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(s.Ledger[k], 10))
	}
	return b.String()
}
