package postgres

import (
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
)

// sqlSKUColumns are the columns scanSKU reads, in its order.
const sqlSKUColumns = `sku, status, shards, shard_span, max_per_order, customer_limit, reservation_ttl_ms, auto_shards, sale_start, sale_end,
	max_hold_ms, one_per_order, admission_mode, token_ttl_ms, waitlist_max, tokens_per_customer, draw_at, version`

const sqlSelectSKU = `SELECT ` + sqlSKUColumns + ` FROM skus WHERE sku`

func scanSKU(row pgx.Row) (*stock.SKU, error) {
	var s stock.SKU
	var status string
	var ttlMS, holdMS, tokenTTLMS int64
	var start, end, drawAt *time.Time
	var mode string
	if err := row.Scan(&s.Name, &status, &s.Shards, &s.ShardSpan, &s.MaxPerOrder, &s.CustomerLimit, &ttlMS, &s.AutoShards, &start, &end,
		&holdMS, &s.OnePerOrder, &mode, &tokenTTLMS, &s.Admission.WaitlistMax, &s.Admission.TokensPerCustomer, &drawAt,
		&s.Version); err != nil {
		return nil, err
	}
	s.Admission.Mode = stock.AdmissionMode(mode)
	s.Admission.TokenTTL = time.Duration(tokenTTLMS) * time.Millisecond
	s.Admission.DrawAt = timeOrZero(drawAt)
	s.Status = stock.Status(status)
	s.ReservationTTL = time.Duration(ttlMS) * time.Millisecond
	s.SaleStart, s.SaleEnd = timeOrZero(start), timeOrZero(end)
	s.MaxHold = time.Duration(holdMS) * time.Millisecond
	return &s, nil
}

// sqlSelectOps reads operations by (sku, idempotency_key), the operations'
// primary key, with their reservation's state: $1 and $2 are the pairs'
// SKUs and keys, element by element (opKeys).
//
// Lookups by a list of keys are written as a LATERAL probe per key rather
// than "= ANY($1)": on a young table the planner prefers a sequential scan
// that tests every row against every key (measured: 3 ms for 64 keys over
// 1,800 rows), where one index probe per key costs microseconds whatever
// the statistics say.
//
// Arrays are unnested in a SELECT list (a ProjectSet) rather than in FROM
// (a function scan, which first copies every element into a tuplestore):
// every group statement does so, reads and writes alike.
const sqlSelectOps = `SELECT o.sku, o.idempotency_key, o.kind, o.params_hash, o.quantity, o.shard,
	o.reservation_id, o.order_ref, o.customer_ref, o.created_at, coalesce(r.state, ''), coalesce(r.expires_at, o.created_at), o.original
	FROM (SELECT unnest($1::text[]) AS sku, unnest($2::text[]) AS key) AS k
	CROSS JOIN LATERAL (SELECT * FROM operations WHERE sku = k.sku AND idempotency_key = k.key) o
	LEFT JOIN LATERAL (SELECT state, expires_at FROM reservations WHERE id = o.reservation_id AND o.reservation_id <> '') r ON true`

func scanOp(row pgx.Row) (*stock.Operation, error) {
	var o stock.Operation
	var kind, state, original string
	err := row.Scan(&o.SKU, &o.IdempotencyKey, &kind, &o.ParamsHash, &o.Quantity, &o.Shard,
		&o.ReservationID, &o.OrderRef, &o.CustomerRef, &o.CreatedAt, &state, &o.ReservationExpiresAt, &original)
	o.Kind = stock.OpKind(kind)
	o.Original = stock.ParseSale(original)
	o.ReservationState = stock.ReservationState(state)
	return &o, err
}

// opKeys are sqlSelectOps's arguments for keys of one SKU.
func opKeys(sku string, keys []string) []any {
	return []any{slices.Repeat([]string{sku}, len(keys)), keys}
}

// scanOps reads sqlSelectOps's rows into a map by key: the caller asked
// for one SKU's keys only, so that a key of another SKU is never taken for
// one of its own.
func scanOps(rows pgx.Rows, err error) (map[string]*stock.Operation, error) {
	out := map[string]*stock.Operation{}
	err = scanOpsFunc(rows, err, func(o *stock.Operation) { out[o.IdempotencyKey] = o })
	return out, err
}

// scanOpsFunc calls add with each of sqlSelectOps's rows.
func scanOpsFunc(rows pgx.Rows, err error, add func(*stock.Operation)) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		o, err := scanOp(rows)
		if err != nil {
			return err
		}
		add(o)
	}
	return rows.Err()
}

const sqlSelectReservations = `SELECT id, sku, shard, idempotency_key, quantity, state, expires_at, order_ref, customer_ref,
	coalesce(committed, CASE WHEN state = 'committed' THEN quantity ELSE 0 END), created_at FROM reservations`

const sqlSelectReservationsByID = `SELECT r.* FROM (SELECT unnest($1::text[]) AS id) AS k CROSS JOIN LATERAL (` + sqlSelectReservations + ` WHERE id = k.id) r`

func scanReservation(row pgx.Row) (*stock.Reservation, error) {
	var r stock.Reservation
	var state string
	err := row.Scan(&r.ID, &r.SKU, &r.Shard, &r.IdempotencyKey, &r.Quantity, &state, &r.ExpiresAt, &r.OrderRef, &r.CustomerRef,
		&r.Committed, &r.CreatedAt)
	r.State = stock.ReservationState(state)
	return &r, err
}

func scanReservations(res pgx.BatchResults) ([]*stock.Reservation, error) {
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*stock.Reservation
	for rows.Next() {
		r, err := scanReservation(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// groupedPart takes the group's number of write_group_seq, once for the
// whole statement (a WITH query that calls a volatile function is run
// once): its operations, reservation ends and checkpoints bear it, so that
// reconciliation tells which of a shard's operations and ends come after
// a checkpoint by the order of its groups, not by a clock
// (migrations/00011_ledger_walk.sql says why that order holds).
var groupedPart = writePart{name: "grouped", sql: `SELECT nextval('write_group_seq') AS seq`}

// opsPart inserts the group's operations, in the order of their primary
// key, (sku, idempotency_key). A key of a SKU taken meanwhile (by a batch
// of another shard of the SKU, or twice in this group) is a unique
// violation (23505): the group aborts with stock.ErrConflict and is rerun,
// and the rerun's lookup sees the key as a replay. A plain
// INSERT says so by itself; ON CONFLICT DO NOTHING with a count of the
// rows inserted said the same at a higher cost per row (measured with
// pg_stat_statements: docs/bench-log/2026-12-04.md).
func opsPart(ops []*stock.Operation) writePart {
	n := len(ops)
	sku, key, kind, res, oref, cref := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	orig := make([]string, n)
	hash := make([][]byte, n)
	qty := make([]int64, n)
	shard := make([]int32, n)
	created := make([]time.Time, n)
	for i, o := range ops {
		sku[i], key[i], kind[i], hash[i], qty[i], shard[i] = o.SKU, o.IdempotencyKey, string(o.Kind), o.ParamsHash, o.Quantity, o.Shard
		res[i], oref[i], cref[i], created[i], orig[i] = o.ReservationID, o.OrderRef, o.CustomerRef, o.CreatedAt, o.Original.ID()
	}
	// created_at is the time the first answer gave (BatchRead.Now), so
	// that a replay gives the same; group_seq is the group's number
	// (groupedPart), which reconciliation orders by.
	return writePart{name: "ops", sql: `INSERT INTO operations (sku, idempotency_key, kind, params_hash, quantity, shard, reservation_id, order_ref,
			customer_ref, created_at, group_seq, original)
		SELECT unnest($1::text[]), unnest($2::text[]), unnest($3::text[]), unnest($4::bytea[]), unnest($5::bigint[]), unnest($6::int[]),
		unnest($7::text[]), unnest($8::text[]), unnest($9::text[]), unnest($10::timestamptz[]), (SELECT seq FROM grouped), unnest($11::text[])`,
		args: []any{sku, key, kind, hash, qty, shard, res, oref, cref, created, orig}}
}

// queueUsageAdd adds units to customers' usage; the WHERE guard refuses an
// update past the limit, which a concurrent batch on another shard may have
// reached: the row count check then aborts the group, which is rerun.
func queueUsageAdd(b *pgx.Batch, ds []usageDelta) {
	sortUsage(ds)
	sku, c, q, limit := make([]string, len(ds)), make([]string, len(ds)), make([]int64, len(ds)), make([]int64, len(ds))
	for i, d := range ds {
		sku[i], c[i], q[i], limit[i] = d.sku, d.customer, d.quantity, d.limit
	}
	b.Queue(`WITH up AS (INSERT INTO customer_usage (sku, customer_ref, quantity)
		SELECT s, c, q FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS u(s, c, q, l)
		ON CONFLICT (sku, customer_ref) DO UPDATE SET quantity = customer_usage.quantity + excluded.quantity
		WHERE customer_usage.quantity + excluded.quantity <= (SELECT l FROM unnest($1::text[], $2::text[], $4::bigint[]) AS v(s, c, l)
			WHERE v.s = excluded.sku AND v.c = excluded.customer_ref)
		RETURNING 1)
		SELECT shardstock_expect(count(*), $5, 'customer usage', 'SS001') FROM up`, sku, c, q, limit, len(ds))
}

// sortUsage orders deltas by SKU and customer: every batch touches usage
// rows in the same order, so two never deadlock.
func sortUsage(ds []usageDelta) {
	slices.SortFunc(ds, func(a, b usageDelta) int { return compareStrings(a.sku+"\x00"+a.customer, b.sku+"\x00"+b.customer) })
}

func queueUsageSub(b *pgx.Batch, ds []usageDelta) {
	sortUsage(ds)
	sku, c, q := make([]string, len(ds)), make([]string, len(ds)), make([]int64, len(ds))
	for i, d := range ds {
		sku[i], c[i], q[i] = d.sku, d.customer, d.quantity
	}
	b.Queue(`UPDATE customer_usage u SET quantity = greatest(u.quantity - d.q, 0)
		FROM unnest($1::text[], $2::text[], $3::bigint[]) AS d(s, c, q) WHERE u.sku = d.s AND u.customer_ref = d.c`, sku, c, q)
}

// shardsPart updates every moved shard row, each compare-and-set
// against its writer's copy: a row that is not what its only writer
// believes is a divergence (SS002), and aborts the group. A halted row is
// never moved, whatever its writer believes: a writer that started from a
// seed (stock.BatchQuery.Seeded) has not read the halt.
func shardsPart(ms []shardMove) writePart {
	n := len(ms)
	sku := make([]string, n)
	idx := make([]int32, n)
	ta, tr, ts, fa, fr, fs := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, m := range ms {
		sku[i], idx[i] = m.shard.SKU, m.shard.Index
		ta[i], tr[i], ts[i], fa[i], fr[i], fs[i] = m.to.Available, m.to.Reserved, m.to.Sold, m.from.Available, m.from.Reserved, m.from.Sold
	}
	return writePart{name: "moved", sql: `UPDATE shards s SET available = m.ta, reserved = m.tr, sold = m.ts, updated_at = now()
		FROM (SELECT unnest($1::text[]) AS sku, unnest($2::int[]) AS idx, unnest($3::bigint[]) AS ta, unnest($4::bigint[]) AS tr,
			unnest($5::bigint[]) AS ts, unnest($6::bigint[]) AS fa, unnest($7::bigint[]) AS fr, unnest($8::bigint[]) AS fs) AS m
		WHERE s.sku = m.sku AND s.idx = m.idx AND s.available = m.fa AND s.reserved = m.fr AND s.sold = m.fs
			AND s.halted_reason = '' RETURNING 1`,
		args: []any{sku, idx, ta, tr, ts, fa, fr, fs}, check: &rowCheck{want: n, what: "shard rows", code: sqlstateDiverged}}
}

// reservationsPart inserts the group's new reservations, held.
func reservationsPart(rs []*stock.Reservation) writePart {
	n := len(rs)
	id, sku, key, oref, cref := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	shard, part := make([]int32, n), make([]int32, n)
	qty := make([]int64, n)
	exp, created := make([]time.Time, n), make([]time.Time, n)
	for i, r := range rs {
		id[i], sku[i], key[i], oref[i], cref[i] = r.ID, r.SKU, r.IdempotencyKey, r.OrderRef, r.CustomerRef
		shard[i], part[i], qty[i], exp[i], created[i] = r.Shard, stock.PartitionOf(r.SKU, r.Shard), r.Quantity, r.ExpiresAt, r.CreatedAt
	}
	// created_at is the time the planner made it (BatchRead.Now), from
	// which its SKU's max_hold counts.
	return writePart{name: "held", sql: `INSERT INTO reservations (id, sku, shard, partition, idempotency_key, quantity, state, expires_at, order_ref,
			customer_ref, created_at)
		SELECT unnest($1::text[]), unnest($2::text[]), unnest($3::int[]), unnest($4::int[]), unnest($5::text[]), unnest($6::bigint[]),
		'held', unnest($7::timestamptz[]), unnest($8::text[]), unnest($9::text[]), unnest($10::timestamptz[])`,
		args: []any{id, sku, shard, part, key, qty, exp, oref, cref, created}}
}

// endsPart ends held reservations, stamped with the group's number
// (groupedPart); the state = 'held' guard makes a second end a no-op that
// the row count reveals (SS002).
func endsPart(ends []stock.ReservationEnd) writePart {
	n := len(ends)
	id, state, reason := make([]string, n), make([]string, n), make([]string, n)
	committed := make([]int64, n)
	for i, e := range ends {
		id[i], state[i], reason[i], committed[i] = e.ID, string(e.State), e.Reason, e.Committed
	}
	return writePart{name: "ended", sql: `UPDATE reservations r SET state = u.state, ended_at = now(), end_reason = u.reason,
			end_group_seq = (SELECT seq FROM grouped), committed = nullif(u.committed, 0)
		FROM (SELECT unnest($1::text[]) AS id, unnest($2::text[]) AS state, unnest($3::text[]) AS reason, unnest($4::bigint[]) AS committed) AS u
		WHERE r.id = u.id AND r.state = 'held' RETURNING 1`,
		args: []any{id, state, reason, committed}, check: &rowCheck{want: n, what: "held reservations", code: sqlstateDiverged}}
}

// extendsPart moves held reservations' expiry; like endsPart, a hold no
// longer held is a divergence (SS002). A reservation is extended and
// ended by one writer only, so it is never in both parts.
func extendsPart(xs []stock.ReservationExtend) writePart {
	n := len(xs)
	id, at := make([]string, n), make([]time.Time, n)
	for i, x := range xs {
		id[i], at[i] = x.ID, x.ExpiresAt
	}
	return writePart{name: "extended", sql: `UPDATE reservations r SET expires_at = u.at
		FROM (SELECT unnest($1::text[]) AS id, unnest($2::timestamptz[]) AS at) AS u
		WHERE r.id = u.id AND r.state = 'held' RETURNING 1`,
		args: []any{id, at}, check: &rowCheck{want: n, what: "extended reservations", code: sqlstateDiverged}}
}

// appliedPart records the first key of each (order_ref, kind) on a SKU
// with one_per_order, sorted by the primary key (no deadlock on the index):
// a pair recorded meanwhile by another shard's batch is a unique violation,
// a conflict whose rerun reads it and refuses ORDER_ALREADY_APPLIED.
func appliedPart(as []stock.OrderApplied) writePart {
	as = slices.Clone(as)
	slices.SortFunc(as, func(a, b stock.OrderApplied) int {
		return compareStrings(a.SKU+"\x00"+a.OrderRef+"\x00"+string(a.Kind), b.SKU+"\x00"+b.OrderRef+"\x00"+string(b.Kind))
	})
	n := len(as)
	sku, oref, kind, key := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, a := range as {
		sku[i], oref[i], kind[i], key[i] = a.SKU, a.OrderRef, string(a.Kind), a.Key
	}
	return writePart{name: "applied", sql: `INSERT INTO order_applied (sku, order_ref, kind, idempotency_key)
		SELECT unnest($1::text[]), unnest($2::text[]), unnest($3::text[]), unnest($4::text[])`,
		args: []any{sku, oref, kind, key}}
}

// queueRefunds adds to the sales' refunded units, guarded by what each
// sold: a refund of the same sale by another shard's writer that got in
// first makes the guard refuse, and the row count aborts the group as a
// conflict (SS001), to be rerun with the new count read. Rows are written
// in (sku, sale) order in every group, so two never deadlock.
func queueRefunds(b *pgx.Batch, rs []stock.RefundAdd) {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b stock.RefundAdd) int { return compareStrings(a.SKU+"\x00"+a.Sale, b.SKU+"\x00"+b.Sale) })
	// One row per sale: a group may refund one sale twice.
	var sku, sale []string
	var sold, q []int64
	for i, r := range rs {
		if i > 0 && r.SKU == sku[len(sku)-1] && r.Sale == sale[len(sale)-1] {
			q[len(q)-1] += r.Quantity
			continue
		}
		sku, sale, sold, q = append(sku, r.SKU), append(sale, r.Sale), append(sold, r.Sold), append(q, r.Quantity)
	}
	b.Queue(`WITH up AS (INSERT INTO refunds AS f (sku, sale, sold, refunded)
		SELECT s, a, so, q FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS u(s, a, so, q) WHERE q <= so
		ON CONFLICT (sku, sale) DO UPDATE SET refunded = f.refunded + excluded.refunded
		WHERE f.refunded + excluded.refunded <= f.sold
		RETURNING 1)
		SELECT shardstock_expect(count(*), $5, 'sale refunds', 'SS001') FROM up`, sku, sale, sold, q, len(sku))
}

// ledgerPart appends the group's ledger entries, each with its writer's
// epoch; returning: it returns them, for the checkpoints (checkpointPart).
func ledgerPart(server string, epochs []int64, es []*stock.LedgerEntry, returning bool) writePart {
	n := len(es)
	sku, kind, key, rid, tid, oref, src, reason, appr, caller := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	shard := make([]int32, n)
	qty, ab, aa, rb, ra, sb, sa := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n),
		make([]int64, n), make([]int64, n), make([]int64, n)
	for i, e := range es {
		sku[i], shard[i], kind[i], qty[i] = e.Shard.SKU, e.Shard.Index, string(e.Kind), e.Quantity
		ab[i], aa[i], rb[i], ra[i], sb[i], sa[i] = e.Before.Available, e.After.Available, e.Before.Reserved, e.After.Reserved, e.Before.Sold, e.After.Sold
		key[i], rid[i], tid[i], oref[i], src[i], reason[i], appr[i] = e.IdempotencyKey, e.ReservationID, e.TransferID, e.OrderRef, e.Source, e.Reason, e.Approver
		caller[i] = e.Caller
	}
	orig := make([]string, n)
	for i, e := range es {
		orig[i] = e.Original.ID()
	}
	sql := `INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after, reserved_before, reserved_after,
		sold_before, sold_after, idempotency_key, reservation_id, transfer_id, order_ref, source, reason, approver, epoch, server_id, caller,
		original)
		SELECT unnest($1::text[]), unnest($2::int[]), unnest($3::text[]), unnest($4::bigint[]), unnest($5::bigint[]), unnest($6::bigint[]),
		unnest($7::bigint[]), unnest($8::bigint[]), unnest($9::bigint[]), unnest($10::bigint[]), unnest($11::text[]), unnest($12::text[]),
		unnest($13::text[]), unnest($14::text[]), unnest($15::text[]), unnest($16::text[]), unnest($17::text[]), unnest($18::bigint[]), $19,
		unnest($20::text[]), unnest($21::text[])`
	if returning {
		sql += ` RETURNING id, sku, shard, kind, available_before, available_after, reserved_after, sold_after`
	}
	return writePart{name: "ledgered", sql: sql,
		args: []any{sku, shard, kind, qty, ab, aa, rb, ra, sb, sa, key, rid, tid, oref, src, reason, appr, epochs, server, caller, orig}}
}

// checkpoint is a shard whose writer asked for a checkpoint after its
// group's entries.
type checkpoint struct {
	shard stock.ShardKey
	// ifDue: only if the shard has ledger.CheckpointEntries entries after
	// its last checkpoint, counting this group's (its writer is new).
	ifDue bool
}

// checkpointPart writes a checkpoint of each shard in cs after its last
// entry in this statement (ledgered returns them): its counts are that
// entry's after, and what it received is its previous checkpoint's (or
// its opening balance) plus the replenishes and adjustments since, those
// of earlier statements (fewer than ledger.CheckpointEntries, read from
// ledger_shard) and this one's. A checkpoint ifDue is written only when
// there are enough entries since the last: at most that many are counted.
func checkpointPart(cs []checkpoint) writePart {
	sku, idx, ifDue := make([]string, len(cs)), make([]int32, len(cs)), make([]bool, len(cs))
	for i, c := range cs {
		sku[i], idx[i], ifDue[i] = c.shard.SKU, c.shard.Index, c.ifDue
	}
	return writePart{name: "checkpointed", sql: `INSERT INTO ledger_checkpoints (sku, shard, entry_id, available, reserved, sold, received, group_seq)
		SELECT l.sku, l.shard, l.id, l.available_after, l.reserved_after, l.sold_after,
			coalesce(c.received, s.opening_available)
			+ (SELECT coalesce(sum(e.available_after - e.available_before), 0) FROM ledger e WHERE e.sku = l.sku AND e.shard = l.shard
				AND e.id > coalesce(c.entry_id, 0) AND e.kind IN ('replenish', 'adjust'))
			+ (SELECT coalesce(sum(b.available_after - b.available_before), 0) FROM ledgered b WHERE b.sku = l.sku AND b.shard = l.shard
				AND b.kind IN ('replenish', 'adjust')),
			(SELECT seq FROM grouped)
		FROM unnest($1::text[], $2::int[], $3::bool[]) AS d(sku, idx, if_due)
		CROSS JOIN LATERAL (SELECT * FROM ledgered b WHERE b.sku = d.sku AND b.shard = d.idx ORDER BY b.id DESC LIMIT 1) l
		JOIN shards s ON s.sku = l.sku AND s.idx = l.shard
		LEFT JOIN LATERAL (` + sqlLatestCheckpoint + `) c ON true
		WHERE NOT d.if_due OR $4 <= (SELECT count(*) FROM ledgered b WHERE b.sku = l.sku AND b.shard = l.shard)
			+ (SELECT count(*) FROM (SELECT FROM ledger e WHERE e.sku = l.sku AND e.shard = l.shard
				AND e.id > coalesce(c.entry_id, 0) LIMIT $4) e)`,
		args: []any{sku, idx, ifDue, ledger.CheckpointEntries}}
}

func timeOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// nullTime is t as a nullable timestamptz: NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
