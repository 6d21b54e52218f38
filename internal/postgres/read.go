package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// readGroup is the group's first round trip: BEGIN; the fences of every
// unit's partition (FOR SHARE, so that a takeover waits for this batch and a
// batch after the takeover sees the new epoch), with the database clock;
// the SKUs; the shard rows of the units that ask (LoadShard); the existing
// operations, reservations, transfers and customer usage of every unit; the
// due holds of the units that sweep. Each unit gets its BatchRead, or
// Err = ErrFenced.
func readGroup(ctx context.Context, conn *pgx.Conn, units []*stock.Unit) ([]*stock.BatchRead, error) {
	q := newGroupQuery(units)
	b := &pgx.Batch{}
	q.queue(b)
	res := conn.SendBatch(ctx, b)
	defer res.Close()
	got, err := q.scan(res)
	if err != nil {
		return nil, err
	}
	if err := res.Close(); err != nil {
		return nil, notCommitted("read", err)
	}
	return got.reads(units), nil
}

// sqlSelectLoadShards reads every shard row of the SKUs $1, for the writers
// that load theirs (scanLoaded).
const sqlSelectLoadShards = `SELECT sku, idx, available, reserved, sold, halted_reason FROM shards WHERE sku = ANY($1::text[])`

// groupQuery is what a group reads, gathered from its units.
type groupQuery struct {
	parts                                                    []int32
	skus, keySKUs, keys, rids, tids, usageSKUs, usageClients []string
	saleSKUs, sales, orderSKUs, orders                       []string
	sweeps                                                   []*stock.Unit
	loadSKUs                                                 []string // of the units that load their row: every shard of each is read
}

func newGroupQuery(units []*stock.Unit) *groupQuery {
	q := &groupQuery{}
	skus := make(map[string]bool, len(units))
	for _, u := range units {
		if u.Query.LoadShard && !slices.Contains(q.loadSKUs, u.Query.Shard.SKU) {
			q.loadSKUs = append(q.loadSKUs, u.Query.Shard.SKU)
		}
		q.parts = append(q.parts, u.Fence.Partition)
		if !skus[u.Query.Shard.SKU] {
			// A hot SKU's shards share a group: its row is read once.
			skus[u.Query.Shard.SKU] = true
			q.skus = append(q.skus, u.Query.Shard.SKU)
		}
		// Each key with its unit's SKU: operations are keyed by the pair.
		for _, k := range u.Query.Keys {
			q.keySKUs, q.keys = append(q.keySKUs, u.Query.Shard.SKU), append(q.keys, k)
		}
		q.rids = append(q.rids, u.Query.ReservationIDs...)
		q.tids = append(q.tids, u.Query.TransferIDs...)
		for _, c := range u.Query.Customers {
			q.usageSKUs, q.usageClients = append(q.usageSKUs, u.Query.Shard.SKU), append(q.usageClients, c)
		}
		for _, o := range u.Query.Orders {
			q.orderSKUs, q.orders = append(q.orderSKUs, u.Query.Shard.SKU), append(q.orders, o)
		}
		for _, s := range u.Query.Sales {
			q.saleSKUs, q.sales = append(q.saleSKUs, u.Query.Shard.SKU), append(q.sales, s)
		}
		if u.Query.SweepMax > 0 {
			q.sweeps = append(q.sweeps, u)
		}
	}
	return q
}

// queue queues the round trip's statements; scan reads their answers in
// the same order.
func (q *groupQuery) queue(b *pgx.Batch) {
	b.Queue("BEGIN")
	b.Queue(`SELECT partition, owner, epoch, now() FROM partitions
		WHERE partition = ANY($1::int[]) ORDER BY partition FOR SHARE`, q.parts)
	b.Queue(`SELECT s.* FROM (SELECT unnest($1::text[]) AS sku) AS k CROSS JOIN LATERAL (`+sqlSelectSKU+` = k.sku) s`, q.skus)
	if len(q.loadSKUs) > 0 {
		// Every shard of the SKU, not only the unit's: the others are
		// seeds for their writers (BatchRead.Siblings), a few rows more
		// for the SKU's first batch instead of a read in each shard's.
		b.Queue(sqlSelectLoadShards, q.loadSKUs)
	}
	if len(q.keys) > 0 {
		b.Queue(sqlSelectOps, q.keySKUs, q.keys)
	}
	if len(q.rids) > 0 {
		b.Queue(sqlSelectReservationsByID, q.rids)
	}
	for _, u := range q.sweeps {
		b.Queue(sqlSelectReservations+` WHERE sku = $1 AND shard = $2 AND state = 'held' AND expires_at <= now() ORDER BY expires_at LIMIT $3`,
			u.Query.Shard.SKU, u.Query.Shard.Index, u.Query.SweepMax)
	}
	if len(q.tids) > 0 {
		b.Queue(sqlSelectTransfersFenced, q.tids)
	}
	if len(q.usageClients) > 0 {
		b.Queue(`SELECT u.sku, u.customer_ref, u.quantity FROM (SELECT unnest($1::text[]) AS sku, unnest($2::text[]) AS c) AS k
			CROSS JOIN LATERAL (SELECT sku, customer_ref, quantity FROM customer_usage WHERE sku = k.sku AND customer_ref = k.c) u`,
			q.usageSKUs, q.usageClients)
	}
	if len(q.sales) > 0 {
		b.Queue(`SELECT f.sku, f.sale, f.refunded FROM (SELECT unnest($1::text[]) AS sku, unnest($2::text[]) AS sale) AS k
			CROSS JOIN LATERAL (SELECT sku, sale, refunded FROM refunds WHERE sku = k.sku AND sale = k.sale) f`, q.saleSKUs, q.sales)
	}
	if len(q.orders) > 0 {
		// Only a SKU with one_per_order records them: for the others
		// this finds nothing, by index.
		b.Queue(`SELECT a.sku, a.kind || ':' || a.order_ref, a.idempotency_key
			FROM (SELECT unnest($1::text[]) AS sku, unnest($2::text[]) AS name) AS k
			CROSS JOIN LATERAL (SELECT sku, kind, order_ref, idempotency_key FROM order_applied
				WHERE sku = k.sku AND kind = split_part(k.name, ':', 1) AND order_ref = substr(k.name, strpos(k.name, ':') + 1)) a`,
			q.orderSKUs, q.orders)
	}
}

// groupRead is what the round trip answered.
type groupRead struct {
	fences       map[int32]fenceRow
	now          time.Time
	skus         map[string]*stock.SKU
	loaded       map[stock.ShardKey]*loadedShard
	healthy      map[string][]stock.ShardRow            // loaded and not halted, by SKU; built by siblings
	ops          map[string]map[string]*stock.Operation // by SKU, then key
	reservations map[string]*stock.Reservation
	due          map[*stock.Unit][]*stock.Reservation
	transfers    map[string]*stock.Transfer
	moveFences   map[string]int64             // by SKU, of the transfers read
	usage        map[string]map[string]int64  // sku -> customer -> units
	refunded     map[string]map[string]int64  // sku -> sale -> units refunded
	applied      map[string]map[string]string // sku -> OrderName -> first key
}

type fenceRow struct {
	owner string
	epoch int64
}

type loadedShard struct {
	counts stock.Counts
	halt   string
}

// scan reads the answers of the statements queue queued, in their order.
// Any error means the transaction did not commit (nothing was written).
func (q *groupQuery) scan(res pgx.BatchResults) (*groupRead, error) {
	g := &groupRead{ops: map[string]map[string]*stock.Operation{}, reservations: map[string]*stock.Reservation{},
		due: map[*stock.Unit][]*stock.Reservation{}, transfers: map[string]*stock.Transfer{}, moveFences: map[string]int64{}, usage: map[string]map[string]int64{},
		refunded: map[string]map[string]int64{}, applied: map[string]map[string]string{}}
	if _, err := res.Exec(); err != nil {
		return nil, notCommitted("begin", err)
	}
	var err error
	if g.fences, g.now, err = scanFences(res); err != nil {
		return nil, notCommitted("fence", err)
	}
	if g.skus, err = scanSKUs(res); err != nil {
		return nil, notCommitted("sku", err)
	}
	if len(q.loadSKUs) > 0 {
		if g.loaded, err = scanLoaded(res); err != nil {
			return nil, notCommitted("shards", err)
		}
	}
	if len(q.keys) > 0 {
		rows, err := res.Query()
		if err := scanOpsFunc(rows, err, g.addOp); err != nil {
			return nil, notCommitted("operations", err)
		}
	}
	if len(q.rids) > 0 {
		if err := scanReservationsInto(res, g.reservations); err != nil {
			return nil, notCommitted("reservations", err)
		}
	}
	for _, u := range q.sweeps {
		if g.due[u], err = scanReservations(res); err != nil {
			return nil, notCommitted("due reservations", err)
		}
	}
	if len(q.tids) > 0 {
		if err := scanTransfersFenced(res, g.transfers, g.moveFences); err != nil {
			return nil, notCommitted("transfers", err)
		}
	}
	if len(q.usageClients) > 0 {
		if err := scanUsage(res, g.usage); err != nil {
			return nil, notCommitted("usage", err)
		}
	}
	if len(q.sales) > 0 {
		if err := scanUsage(res, g.refunded); err != nil { // the same shape: sku, name, units
			return nil, notCommitted("refunds", err)
		}
	}
	if len(q.orders) > 0 {
		if err := scanApplied(res, g.applied); err != nil {
			return nil, notCommitted("orders applied", err)
		}
	}
	return g, nil
}

func scanFences(res pgx.BatchResults) (map[int32]fenceRow, time.Time, error) {
	fences := map[int32]fenceRow{}
	var now time.Time
	rows, err := res.Query()
	if err != nil {
		return nil, now, err
	}
	var p int32
	var f fenceRow
	_, err = pgx.ForEachRow(rows, []any{&p, &f.owner, &f.epoch, &now}, func() error { fences[p] = f; return nil })
	return fences, now, err
}

func scanSKUs(res pgx.BatchResults) (map[string]*stock.SKU, error) {
	return collectSKUs(res.Query())
}

// collectSKUs reads rows of sqlSelectSKU's columns into a map by name.
func collectSKUs(rows pgx.Rows, err error) (map[string]*stock.SKU, error) {
	if err != nil {
		return nil, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*stock.SKU, error) { return scanSKU(r) })
	if err != nil {
		return nil, err
	}
	bySKU := make(map[string]*stock.SKU, len(list))
	for _, s := range list {
		bySKU[s.Name] = s
	}
	return bySKU, nil
}

func scanLoaded(res pgx.BatchResults) (map[stock.ShardKey]*loadedShard, error) {
	loaded := map[stock.ShardKey]*loadedShard{}
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	var k stock.ShardKey
	var l loadedShard
	_, err = pgx.ForEachRow(rows, []any{&k.SKU, &k.Index, &l.counts.Available, &l.counts.Reserved, &l.counts.Sold, &l.halt}, func() error {
		ll := l
		loaded[k] = &ll
		return nil
	})
	return loaded, err
}

func scanReservationsInto(res pgx.BatchResults, into map[string]*stock.Reservation) error {
	rs, err := scanReservations(res)
	for _, r := range rs {
		into[r.ID] = r
	}
	return err
}

func scanUsage(res pgx.BatchResults, into map[string]map[string]int64) error {
	rows, err := res.Query()
	if err != nil {
		return err
	}
	var sku, c string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&sku, &c, &n}, func() error {
		if into[sku] == nil {
			into[sku] = map[string]int64{}
		}
		into[sku][c] = n
		return nil
	})
	return err
}

func scanApplied(res pgx.BatchResults, into map[string]map[string]string) error {
	rows, err := res.Query()
	if err != nil {
		return err
	}
	var sku, name, key string
	_, err = pgx.ForEachRow(rows, []any{&sku, &name, &key}, func() error {
		if into[sku] == nil {
			into[sku] = map[string]string{}
		}
		into[sku][name] = key
		return nil
	})
	return err
}

// addOp files an operation read under its SKU.
func (g *groupRead) addOp(o *stock.Operation) {
	if g.ops[o.SKU] == nil {
		g.ops[o.SKU] = map[string]*stock.Operation{}
	}
	g.ops[o.SKU][o.IdempotencyKey] = o
}

// siblings are the loaded shards of k's SKU other than k that are not
// halted.
func (g *groupRead) siblings(k stock.ShardKey) []stock.ShardRow {
	if g.healthy == nil {
		g.healthy = map[string][]stock.ShardRow{}
		for sk, l := range g.loaded {
			if l.halt == "" {
				g.healthy[sk.SKU] = append(g.healthy[sk.SKU], stock.ShardRow{Index: sk.Index, Counts: l.counts})
			}
		}
	}
	var out []stock.ShardRow
	for _, r := range g.healthy[k.SKU] {
		if r.Index != k.Index {
			out = append(out, r)
		}
	}
	return out
}

// reads gives every unit what it read, or Err = ErrFenced when its
// partition's fence is not its writer's.
func (g *groupRead) reads(units []*stock.Unit) []*stock.BatchRead {
	reads := make([]*stock.BatchRead, len(units))
	none := map[string]*stock.Operation{} // of every unit whose SKU has none (read only)
	for i, u := range units {
		got, ok := g.fences[u.Fence.Partition]
		if !ok || got.owner != u.Fence.ServerID || got.epoch != u.Fence.Epoch {
			u.Err = fmt.Errorf("%w: partition %d is %s@%d, writer is %s@%d", stock.ErrFenced, u.Fence.Partition, got.owner, got.epoch, u.Fence.ServerID, u.Fence.Epoch)
			continue
		}
		// A unit sees its SKU's operations, those of every shard of it:
		// a key recorded on one shard is a replay on another. It sees
		// every reservation read: one of another unit is refused by the
		// planner's own checks (SKU, shard).
		ops := g.ops[u.Query.Shard.SKU]
		if ops == nil {
			ops = none
		}
		read := &stock.BatchRead{SKU: g.skus[u.Query.Shard.SKU], Ops: ops, Reservations: g.reservations, Due: g.due[u],
			Usage: g.usage[u.Query.Shard.SKU], Transfers: g.transfers, MoveFences: g.moveFences, Now: g.now}
		if u.Query.LoadShard {
			read.ShardRead = true
			if l := g.loaded[u.Query.Shard]; l != nil {
				read.Counts, read.HaltReason = &l.counts, l.halt
			}
			read.Siblings = g.siblings(u.Query.Shard)
		}
		if read.Usage == nil {
			read.Usage = map[string]int64{}
		}
		if read.Refunded = g.refunded[u.Query.Shard.SKU]; read.Refunded == nil {
			read.Refunded = map[string]int64{}
		}
		if read.Applied = g.applied[u.Query.Shard.SKU]; read.Applied == nil {
			read.Applied = map[string]string{}
		}
		reads[i] = read
	}
	return reads
}
