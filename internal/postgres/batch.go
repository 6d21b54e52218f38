package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardstock/shardstock/internal/stock"
)

// Batch runs one shard's batch: a group of one.
func (db *DB) Batch(ctx context.Context, f stock.Fence, q stock.BatchQuery, decide stock.Decide) error {
	u := &stock.Unit{Fence: f, Query: q, Decide: decide}
	if err := db.Group(ctx, []*stock.Unit{u}); err != nil {
		return err
	}
	return u.Err
}

// Group runs the batches of many shards (of this server, each from its own
// writer) in one transaction of two round trips: BEGIN with every read
// (fences, lookups), then each unit decides in memory, then every write with
// COMMIT. The statements are the same whatever the number of units (each
// reads or writes the rows of all units at once), so a group costs Postgres
// about what one batch costs, and concurrent writers share one commit.
//
// A unit whose fence fails gets Err = stock.ErrFenced and writes nothing; the
// others go on. Any other failure is the group's: Group returns it and no
// unit committed (stock.ErrConflict, stock.ErrDiverged, stock.ErrNotCommitted, or an error of
// a stock.Decide), except stock.ErrOutcomeUnknown, after which none is known.
func (db *DB) Group(ctx context.Context, units []*stock.Unit) (err error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: acquire: %v", stock.ErrNotCommitted, err)
	}
	defer func() {
		// A transaction left open (refused, failed or empty) is rolled
		// back; a broken connection is dropped by the pool on release.
		if st := conn.Conn().PgConn().TxStatus(); st != 'I' && !conn.Conn().IsClosed() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				conn.Conn().Close(rctx)
			}
			cancel()
		}
		conn.Release()
	}()

	reads, err := readGroup(ctx, conn.Conn(), units)
	if err != nil {
		return err
	}
	var writes []unitWrite
	for i, u := range units {
		if u.Err != nil {
			continue
		}
		w, err := u.Decide(reads[i])
		if err != nil {
			return err
		}
		if !w.Empty() {
			writes = append(writes, unitWrite{u: u, w: w})
		}
	}
	if len(writes) == 0 {
		return nil // nothing to write: the deferred rollback ends it
	}
	mark := newCommitMark(writes[0].u.Fence.ServerID)
	committing, err := writeGroup(ctx, conn.Conn(), mark, writes)
	if err != nil && committing {
		return db.commitOutcome(ctx, mark, err)
	}
	return err
}

// unitWrite is what one unit decided to write.
type unitWrite struct {
	u *stock.Unit
	w *stock.BatchWrite
}

// readGroup is the group's first round trip: BEGIN; the fences of every
// unit's partition (FOR SHARE, so that a takeover waits for this batch and a
// batch after the takeover sees the new epoch), with the database clock; the SKUs; the
// shard rows of the units that ask (LoadShard); the existing operations, reservations, transfers and customer usage of every
// unit; the due holds of the units that sweep.
func readGroup(ctx context.Context, conn *pgx.Conn, units []*stock.Unit) ([]*stock.BatchRead, error) {
	var parts []int32
	var skus, keys, rids, tids, usageSKUs, usageCustomers []string
	var sweeps []*stock.Unit
	var loadSKUs []string
	var loadIdx []int32
	for _, u := range units {
		if u.Query.LoadShard {
			loadSKUs, loadIdx = append(loadSKUs, u.Query.Shard.SKU), append(loadIdx, u.Query.Shard.Index)
		}
		parts = append(parts, u.Fence.Partition)
		skus = append(skus, u.Query.Shard.SKU)
		keys = append(keys, u.Query.Keys...)
		rids = append(rids, u.Query.ReservationIDs...)
		tids = append(tids, u.Query.TransferIDs...)
		for _, c := range u.Query.Customers {
			usageSKUs, usageCustomers = append(usageSKUs, u.Query.Shard.SKU), append(usageCustomers, c)
		}
		if u.Query.SweepMax > 0 {
			sweeps = append(sweeps, u)
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT partition, owner, epoch, now() FROM partitions
		WHERE partition = ANY($1::int[]) ORDER BY partition FOR SHARE`, parts)
	b.Queue(`SELECT s.* FROM unnest($1::text[]) AS k(sku) CROSS JOIN LATERAL (`+sqlSelectSKU+` = k.sku) s`, skus)
	if len(loadSKUs) > 0 {
		b.Queue(`SELECT sh.sku, sh.idx, sh.available, sh.reserved, sh.sold, sh.halted_reason FROM unnest($1::text[], $2::int[]) AS k(sku, idx)
			CROSS JOIN LATERAL (SELECT sku, idx, available, reserved, sold, halted_reason FROM shards WHERE sku = k.sku AND idx = k.idx) sh`,
			loadSKUs, loadIdx)
	}
	if len(keys) > 0 {
		b.Queue(sqlSelectOps, keys)
	}
	if len(rids) > 0 {
		b.Queue(sqlSelectReservationsByID, rids)
	}
	for _, u := range sweeps {
		b.Queue(sqlSelectReservations+` WHERE sku = $1 AND shard = $2 AND state = 'held' AND expires_at <= now() ORDER BY expires_at LIMIT $3`,
			u.Query.Shard.SKU, u.Query.Shard.Index, u.Query.SweepMax)
	}
	if len(tids) > 0 {
		b.Queue(`SELECT t.* FROM unnest($1::text[]) AS k(id) CROSS JOIN LATERAL (`+sqlSelectTransfers+` WHERE id = k.id) t`, tids)
	}
	if len(usageCustomers) > 0 {
		b.Queue(`SELECT u.sku, u.customer_ref, u.quantity FROM unnest($1::text[], $2::text[]) AS k(sku, c)
			CROSS JOIN LATERAL (SELECT sku, customer_ref, quantity FROM customer_usage WHERE sku = k.sku AND customer_ref = k.c) u`,
			usageSKUs, usageCustomers)
	}
	res := conn.SendBatch(ctx, b)
	defer res.Close()

	if _, err := res.Exec(); err != nil {
		return nil, notCommitted("begin", err)
	}
	type fence struct {
		owner string
		epoch int64
	}
	fences := map[int32]fence{}
	var now time.Time
	rows, err := res.Query()
	if err != nil {
		return nil, notCommitted("fence", err)
	}
	var p int32
	var f fence
	if _, err := pgx.ForEachRow(rows, []any{&p, &f.owner, &f.epoch, &now}, func() error { fences[p] = f; return nil }); err != nil {
		return nil, notCommitted("fence", err)
	}
	rows, err = res.Query()
	if err != nil {
		return nil, notCommitted("sku", err)
	}
	skuRows, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.SKU, error) { return scanSKU(r) })
	if err != nil {
		return nil, notCommitted("sku", err)
	}
	bySKU := map[string]*stock.SKU{}
	for _, s := range skuRows {
		bySKU[s.SKU] = s
	}
	type loadedShard struct {
		counts stock.Counts
		halt   string
	}
	loaded := map[stock.ShardKey]*loadedShard{}
	if len(loadSKUs) > 0 {
		rows, err := res.Query()
		if err != nil {
			return nil, notCommitted("shards", err)
		}
		var k stock.ShardKey
		var l loadedShard
		_, err = pgx.ForEachRow(rows, []any{&k.SKU, &k.Index, &l.counts.Available, &l.counts.Reserved, &l.counts.Sold, &l.halt}, func() error {
			ll := l
			loaded[k] = &ll
			return nil
		})
		if err != nil {
			return nil, notCommitted("shards", err)
		}
	}
	ops := map[string]*stock.Operation{}
	if len(keys) > 0 {
		if err := scanOps(res, ops); err != nil {
			return nil, notCommitted("operations", err)
		}
	}
	reservations := map[string]*stock.Reservation{}
	if len(rids) > 0 {
		rs, err := scanReservations(res)
		if err != nil {
			return nil, notCommitted("reservations", err)
		}
		for _, r := range rs {
			reservations[r.ID] = r
		}
	}
	due := map[*stock.Unit][]*stock.Reservation{}
	for _, u := range sweeps {
		if due[u], err = scanReservations(res); err != nil {
			return nil, notCommitted("due reservations", err)
		}
	}
	transfers := map[string]*stock.Transfer{}
	if len(tids) > 0 {
		ts, err := scanTransfers(res)
		if err != nil {
			return nil, notCommitted("transfers", err)
		}
		for _, t := range ts {
			transfers[t.ID] = t
		}
	}
	usage := map[string]map[string]int64{} // sku -> customer -> units
	if len(usageCustomers) > 0 {
		rows, err := res.Query()
		if err != nil {
			return nil, notCommitted("usage", err)
		}
		var sku, c string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&sku, &c, &n}, func() error {
			if usage[sku] == nil {
				usage[sku] = map[string]int64{}
			}
			usage[sku][c] = n
			return nil
		})
		if err != nil {
			return nil, notCommitted("usage", err)
		}
	}
	if err := res.Close(); err != nil {
		return nil, notCommitted("read", err)
	}

	reads := make([]*stock.BatchRead, len(units))
	for i, u := range units {
		got, ok := fences[u.Fence.Partition]
		if !ok || got.owner != u.Fence.ServerID || got.epoch != u.Fence.Epoch {
			u.Err = fmt.Errorf("%w: partition %d is %s@%d, writer is %s@%d", stock.ErrFenced, u.Fence.Partition, got.owner, got.epoch, u.Fence.ServerID, u.Fence.Epoch)
			continue
		}
		// Every unit sees every lookup: a key or a reservation of another
		// unit is refused by the planner's own checks (SKU, shard).
		read := &stock.BatchRead{SKU: bySKU[u.Query.Shard.SKU], Ops: ops, Reservations: reservations, Due: due[u],
			Usage: usage[u.Query.Shard.SKU], Transfers: transfers, Now: now}
		if l := loaded[u.Query.Shard]; u.Query.LoadShard && l != nil {
			read.Counts, read.HaltReason = &l.counts, l.halt
		}
		if read.Usage == nil {
			read.Usage = map[string]int64{}
		}
		reads[i] = read
	}
	return reads, nil
}

// Error codes raised by shardstock_expect inside a write statement.
const (
	sqlstateConflict = "SS001"
	sqlstateDiverged = "SS002"
	sqlstateUnique   = "23505"
)

// writeGroup is the group's second round trip, ending in COMMIT. Operations
// are inserted with ON CONFLICT DO NOTHING in key order (so two batches never
// deadlock on the unique index); a key that conflicts was taken by another
// shard meanwhile, and the statement's own row count check aborts the
// transaction, so that the batch is rerun (the rerun's lookup then sees the
// key as a replay) rather than counted a success. Each shard row is updated
// once, compare-and-set against its writer's copy.
//
// The group's commit mark goes first: it is how a lost COMMIT's outcome is
// learnt (commitOutcome), and a void of it that got in first (the outcome
// was asked while this transaction still ran) then aborts it at once.
//
// committing is true when the error may have come from the COMMIT itself,
// whose outcome must then be learnt.
func writeGroup(ctx context.Context, conn *pgx.Conn, mark commitMark, writes []unitWrite) (committing bool, err error) {
	var all stock.BatchWrite
	var shards []shardMove
	var usageAdd, usageSub []usageDelta
	epochs := make([]int64, 0)
	for _, uw := range writes {
		w := uw.w
		all.Ops = append(all.Ops, w.Ops...)
		all.NewReservations = append(all.NewReservations, w.NewReservations...)
		all.Ended = append(all.Ended, w.Ended...)
		all.Steps = append(all.Steps, w.Steps...)
		all.Ledger = append(all.Ledger, w.Ledger...)
		for range w.Ledger {
			epochs = append(epochs, uw.u.Fence.Epoch)
		}
		sku := uw.u.Query.Shard.SKU
		for c, q := range w.UsageAdd {
			usageAdd = addUsage(usageAdd, usageDelta{sku: sku, customer: c, quantity: q, limit: w.UsageLimit})
		}
		for c, q := range w.UsageSub {
			usageSub = addUsage(usageSub, usageDelta{sku: sku, customer: c, quantity: q})
		}
		if w.From != w.To {
			shards = append(shards, shardMove{shard: uw.u.Query.Shard, from: w.From, to: w.To})
		}
	}
	b := &pgx.Batch{}
	queueInsertMark(b, mark)
	slices.SortFunc(all.Ops, func(a, b *stock.Operation) int { return compareStrings(a.IdempotencyKey, b.IdempotencyKey) })
	if len(all.Ops) > 0 {
		queueInsertOps(b, all.Ops)
	}
	// Give units back before taking more, as the planner counted them.
	if len(usageSub) > 0 {
		queueUsageSub(b, usageSub)
	}
	if len(usageAdd) > 0 {
		queueUsageAdd(b, usageAdd)
	}
	if len(all.NewReservations) > 0 {
		queueInsertReservations(b, all.NewReservations)
	}
	if len(all.Ended) > 0 {
		queueEndReservations(b, all.Ended)
	}
	if len(all.Steps) > 0 {
		queueStepTransfers(b, all.Steps)
	}
	if len(shards) > 0 {
		queueMoveShards(b, shards)
	}
	if len(all.Ledger) > 0 {
		queueInsertLedger(b, writes[0].u.Fence.ServerID, epochs, all.Ledger)
	}
	b.Queue("COMMIT")
	res := conn.SendBatch(ctx, b)
	defer res.Close()

	for i := 0; i < b.Len()-1; i++ {
		if _, err := res.Exec(); err != nil {
			// The server answering an error before COMMIT aborts the
			// transaction. Anything else (the connection lost) leaves the
			// COMMIT sent behind it in doubt: its outcome must be learnt.
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return true, err
			}
			return false, classify(err)
		}
	}
	if _, err := res.Exec(); err != nil {
		return true, err
	}
	if err := res.Close(); err != nil {
		return true, err
	}
	// A COMMIT in a failed transaction answers ROLLBACK without an error.
	if st := conn.PgConn().TxStatus(); st != 'I' {
		return false, fmt.Errorf("%w: transaction still open after COMMIT (%c)", stock.ErrNotCommitted, st)
	}
	return false, nil
}

// shardMove is one shard row's compare-and-set.
type shardMove struct {
	shard    stock.ShardKey
	from, to stock.Counts
}

// usageDelta is one customer's change of usage of one SKU.
type usageDelta struct {
	sku, customer   string
	quantity, limit int64
}

// addUsage adds d to ds, summing with an entry of the same SKU and customer
// (two shards of one SKU in one group): one statement may touch a row once.
func addUsage(ds []usageDelta, d usageDelta) []usageDelta {
	for i := range ds {
		if ds[i].sku == d.sku && ds[i].customer == d.customer {
			ds[i].quantity += d.quantity
			return ds
		}
	}
	return append(ds, d)
}

// classify maps a write statement's error to a batch error.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateConflict, sqlstateUnique:
			return fmt.Errorf("%w: %s", stock.ErrConflict, pgErr.Message)
		case sqlstateDiverged:
			return fmt.Errorf("%w: %s", stock.ErrDiverged, pgErr.Message)
		}
	}
	return notCommitted("write", err)
}

func notCommitted(step string, err error) error {
	return fmt.Errorf("%w: %s: %v", stock.ErrNotCommitted, step, err)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
