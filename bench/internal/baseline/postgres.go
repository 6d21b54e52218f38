package baseline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/stock"
)

// Limits of the Postgres baselines.
const (
	pgConnsDefault = 50 // of the 100 connections a default Postgres allows
	closeTimeout   = time.Minute
)

// PostgresConfig configures a Postgres baseline.
type PostgresConfig struct {
	DatabaseURL string
	// MaxConns bounds the connection pool; default 50. Every Postgres
	// baseline of a comparison should get the same.
	MaxConns int32
}

type pgMode uint8

const (
	modeNaive   pgMode = iota // (1) SELECT, then UPDATE without a condition
	modeOneRow                // (2) one row, one transaction per request
	modeSubRows               // (3) N sub-rows, one transaction per request
)

// Postgres is a baseline on Postgres, in a schema of its own that Setup
// creates and Close drops.
type Postgres struct {
	cfg    PostgresConfig
	mode   pgMode
	schema string
	pool   *pgxpool.Pool
	rows   map[string]int32 // rows per SKU; read-only after Setup
	q      pgQueries
}

var (
	_ loadgen.Target   = (*Postgres)(nil)
	_ loadgen.Baseline = (*Postgres)(nil)
)

// NewNaive returns baseline (1), the source document's 误区一: it reads the
// stock, decides in the client, then updates without a condition, in
// separate statements and without idempotency. It can oversell and apply a
// key twice; the load generator reports what it did.
func NewNaive(cfg PostgresConfig) *Postgres { return newPostgres(cfg, modeNaive) }

// NewOneRow returns baseline (2): one row per SKU and one transaction per
// request: an idempotency record (INSERT ... ON CONFLICT DO NOTHING), a
// conditional UPDATE (available >= q) and a ledger row.
func NewOneRow(cfg PostgresConfig) *Postgres { return newPostgres(cfg, modeOneRow) }

// NewSubRows returns baseline (3): as (2), but each SKU's stock is split over
// as many rows as it has shards; a request starts at the row its key hashes
// to and tries the next rows while a row has not enough. No batching.
func NewSubRows(cfg PostgresConfig) *Postgres { return newPostgres(cfg, modeSubRows) }

func newPostgres(cfg PostgresConfig, mode pgMode) *Postgres {
	if cfg.MaxConns == 0 {
		cfg.MaxConns = pgConnsDefault
	}
	return &Postgres{cfg: cfg, mode: mode}
}

// Name is naive, onerow or subrows.
func (p *Postgres) Name() string { return [...]string{"naive", "onerow", "subrows"}[p.mode] }

// Baseline reports true: a baseline is measured, not held to the rules.
func (p *Postgres) Baseline() bool { return true }

// pgQueries are the statements, qualified with the baseline's schema.
type pgQueries struct {
	naiveSelect, naiveDeduct, naiveReserve                     string
	insertOp, selectOp                                         string
	deductRow, reserveRow                                      string
	insertReservation, insertLedger                            string
	endReservation, selectReservation, reservationState        string
	commitStock, releaseStock                                  string
	verifyCounts, verifyLedger, verifyKeys, verifyRowBalance   string
	verifyEnds                                                 string
	verifyHolds, verifyOpsWithoutLedger, verifyLedgerWithoutOp string
}

func newPGQueries(schema string) pgQueries {
	s := pgx.Identifier{schema}.Sanitize()
	r := strings.NewReplacer("S.", s+".")
	q := func(sql string) string { return r.Replace(sql) }
	return pgQueries{
		naiveSelect:  q(`SELECT available FROM S.stock WHERE sku = $1 AND idx = 0`),
		naiveDeduct:  q(`UPDATE S.stock SET available = available - $2, sold = sold + $2 WHERE sku = $1 AND idx = 0`),
		naiveReserve: q(`UPDATE S.stock SET available = available - $2, reserved = reserved + $2 WHERE sku = $1 AND idx = 0`),

		insertOp: q(`INSERT INTO S.operations (sku, idempotency_key, kind, quantity, reservation_id)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`),
		selectOp: q(`SELECT kind, quantity, coalesce(reservation_id, '') FROM S.operations WHERE sku = $1 AND idempotency_key = $2`),
		deductRow: q(`UPDATE S.stock SET available = available - $3, sold = sold + $3
			WHERE sku = $1 AND idx = $2 AND available >= $3`),
		reserveRow: q(`UPDATE S.stock SET available = available - $3, reserved = reserved + $3
			WHERE sku = $1 AND idx = $2 AND available >= $3`),

		insertReservation: q(`INSERT INTO S.reservations (id, sku, idx, quantity, state, idempotency_key)
			VALUES ($1, $2, $3, $4, 'held', $5)`),
		insertLedger: q(`INSERT INTO S.ledger (sku, idx, kind, quantity, idempotency_key, reservation_id, d_available, d_reserved, d_sold)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`),
		endReservation: q(`UPDATE S.reservations SET state = $2 WHERE id = $1 AND state = 'held'
			RETURNING sku, idx, quantity, idempotency_key`),
		selectReservation: q(`SELECT sku, idx, quantity, idempotency_key, state FROM S.reservations WHERE id = $1`),
		reservationState:  q(`UPDATE S.reservations SET state = $2 WHERE id = $1`),
		commitStock:       q(`UPDATE S.stock SET reserved = reserved - $3, sold = sold + $3 WHERE sku = $1 AND idx = $2`),
		releaseStock:      q(`UPDATE S.stock SET reserved = reserved - $3, available = available + $3 WHERE sku = $1 AND idx = $2`),

		verifyCounts: q(`SELECT sku, sum(available)::bigint, sum(reserved)::bigint, sum(sold)::bigint FROM S.stock GROUP BY sku`),
		verifyLedger: q(`SELECT sku, kind, count(*) FROM S.ledger GROUP BY sku, kind`),
		verifyKeys: q(`SELECT sku, count(*), count(DISTINCT idempotency_key) FROM S.ledger
			WHERE kind IN ('deduct', 'reserve') GROUP BY sku`),
		verifyEnds: q(`SELECT sku, count(*) - count(DISTINCT reservation_id) FROM S.ledger
			WHERE kind IN ('commit', 'release', 'expire') GROUP BY sku`),
		verifyRowBalance: q(`SELECT s.sku, s.idx, s.initial + coalesce(l.da, 0), s.available, coalesce(l.dr, 0), s.reserved, coalesce(l.ds, 0), s.sold
			FROM S.stock s LEFT JOIN (
				SELECT sku, idx, sum(d_available)::bigint AS da, sum(d_reserved)::bigint AS dr, sum(d_sold)::bigint AS ds
				FROM S.ledger GROUP BY sku, idx) l USING (sku, idx)
			WHERE s.initial + coalesce(l.da, 0) <> s.available OR coalesce(l.dr, 0) <> s.reserved OR coalesce(l.ds, 0) <> s.sold`),
		verifyHolds: q(`SELECT s.sku, s.idx, coalesce(h.q, 0), s.reserved
			FROM S.stock s LEFT JOIN (
				SELECT sku, idx, sum(quantity)::bigint AS q FROM S.reservations WHERE state = 'held' GROUP BY sku, idx) h USING (sku, idx)
			WHERE coalesce(h.q, 0) <> s.reserved`),
		verifyOpsWithoutLedger: q(`SELECT o.sku, count(*) FROM S.operations o
			LEFT JOIN (SELECT sku, idempotency_key, kind, count(*) AS n FROM S.ledger GROUP BY 1, 2, 3) l USING (sku, idempotency_key, kind)
			WHERE l.n IS DISTINCT FROM 1 GROUP BY o.sku`),
		verifyLedgerWithoutOp: q(`SELECT l.sku, count(*) FROM S.ledger l
			LEFT JOIN S.operations o USING (sku, idempotency_key)
			WHERE l.kind IN ('deduct', 'reserve') AND o.sku IS NULL GROUP BY l.sku`),
	}
}

// schemaSQL creates the baseline's tables. The naive baseline has neither
// CHECK constraints nor an idempotency table: it trusts its own reads.
func (p *Postgres) schemaSQL() string {
	check := `, CHECK (available >= 0 AND reserved >= 0)`
	if p.mode == modeNaive {
		check = ""
	}
	ops := `CREATE TABLE S.operations (
		sku text NOT NULL,
		idempotency_key text NOT NULL,
		kind text NOT NULL,
		quantity bigint NOT NULL,
		reservation_id text,
		created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (sku, idempotency_key));`
	if p.mode == modeNaive {
		ops = ""
	}
	sql := `CREATE SCHEMA SCHEMA;
	CREATE TABLE S.stock (
		sku text NOT NULL,
		idx int NOT NULL,
		initial bigint NOT NULL,
		available bigint NOT NULL,
		reserved bigint NOT NULL,
		sold bigint NOT NULL,
		PRIMARY KEY (sku, idx)` + check + `);
	` + ops + `
	CREATE TABLE S.reservations (
		id text PRIMARY KEY,
		sku text NOT NULL,
		idx int NOT NULL,
		quantity bigint NOT NULL,
		state text NOT NULL,
		idempotency_key text NOT NULL);
	CREATE TABLE S.ledger (
		id bigserial PRIMARY KEY,
		sku text NOT NULL,
		idx int NOT NULL,
		kind text NOT NULL,
		quantity bigint NOT NULL,
		idempotency_key text NOT NULL,
		reservation_id text,
		d_available bigint NOT NULL,
		d_reserved bigint NOT NULL,
		d_sold bigint NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now());`
	ident := pgx.Identifier{p.schema}.Sanitize()
	return strings.NewReplacer("SCHEMA SCHEMA", "SCHEMA "+ident, "S.", ident+".").Replace(sql)
}

// Setup connects, creates the schema and the SKUs' rows, the stock of each
// SKU split evenly over its rows.
func (p *Postgres) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	if p.cfg.DatabaseURL == "" {
		return errors.New("baseline: no database URL (set DATABASE_URL)")
	}
	pc, err := pgxpool.ParseConfig(p.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("baseline: database URL: %w", err)
	}
	pc.MaxConns = p.cfg.MaxConns
	if p.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("baseline: connect: %w", err)
	}
	p.schema = "loadgen_" + p.Name() + "_" + randomHex(4)
	p.q = newPGQueries(p.schema)
	if _, err := p.pool.Exec(ctx, p.schemaSQL()); err != nil {
		return fmt.Errorf("baseline: %s: create schema: %w", p.Name(), err)
	}
	p.rows = make(map[string]int32, len(skus))
	var rows [][]any
	for _, s := range skus {
		n := int32(1)
		if p.mode == modeSubRows {
			n = max(s.Shards, 1)
		}
		p.rows[s.SKU] = n
		for i := range n {
			part := s.Stock / int64(n)
			if int64(i) < s.Stock%int64(n) {
				part++
			}
			rows = append(rows, []any{s.SKU, i, part, part, int64(0), int64(0)})
		}
	}
	_, err = p.pool.CopyFrom(ctx, pgx.Identifier{p.schema, "stock"},
		[]string{"sku", "idx", "initial", "available", "reserved", "sold"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("baseline: %s: create SKUs: %w", p.Name(), err)
	}
	return p.warm(ctx)
}

// warm opens every connection of the pool before the load starts, so that
// no request pays for a connection set-up.
func (p *Postgres) warm(ctx context.Context) error {
	conns := make([]*pgxpool.Conn, 0, p.cfg.MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range p.cfg.MaxConns {
		c, err := p.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("baseline: %s: connect: %w", p.Name(), err)
		}
		conns = append(conns, c)
	}
	return nil
}

// Close drops the schema and closes the pool.
func (p *Postgres) Close() error {
	if p.pool == nil {
		return nil
	}
	defer p.pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if _, err := p.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{p.schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("baseline: %s: drop schema %s: %w", p.Name(), p.schema, err)
	}
	return nil
}

// Deduct takes qty units.
func (p *Postgres) Deduct(ctx context.Context, sku, key string, qty int64) loadgen.Outcome {
	if p.mode == modeNaive {
		_, o := p.naiveTake(ctx, stock.OpDeduct, sku, key, qty)
		return o
	}
	_, o := p.take(ctx, stock.OpDeduct, sku, key, qty)
	return o
}

// Reserve holds qty units.
func (p *Postgres) Reserve(ctx context.Context, sku, key string, qty int64) (string, loadgen.Outcome) {
	if p.mode == modeNaive {
		return p.naiveTake(ctx, stock.OpReserve, sku, key, qty)
	}
	return p.take(ctx, stock.OpReserve, sku, key, qty)
}

// Commit sells a held reservation.
func (p *Postgres) Commit(ctx context.Context, id string) loadgen.Outcome {
	if p.mode == modeNaive {
		return p.naiveEnd(ctx, stock.OpCommit, id)
	}
	return p.end(ctx, stock.OpCommit, id)
}

// Release returns a held reservation's units.
func (p *Postgres) Release(ctx context.Context, id string) loadgen.Outcome {
	if p.mode == modeNaive {
		return p.naiveEnd(ctx, stock.OpRelease, id)
	}
	return p.end(ctx, stock.OpRelease, id)
}

// Verify reads every SKU's counts and checks the ledger against the rows,
// the held reservations against reserved, and (but for naive) every
// operation against exactly one ledger entry.
func (p *Postgres) Verify(ctx context.Context, skus []loadgen.SKUSpec) (loadgen.State, error) {
	st := loadgen.State{SKUs: make(map[string]loadgen.SKUState, len(skus))}
	get := func(sku string) loadgen.SKUState {
		s, ok := st.SKUs[sku]
		if !ok {
			s.Ledger = map[string]int64{}
		}
		return s
	}
	each := func(sql string, scan func(pgx.Rows) error) error {
		rows, err := p.pool.Query(ctx, sql)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	add := func(sku string, d loadgen.Discrepancy) {
		s := get(sku)
		s.Discrepancies = append(s.Discrepancies, d)
		st.SKUs[sku] = s
	}
	checks := []struct {
		sql  string
		scan func(pgx.Rows) error
	}{
		{p.q.verifyCounts, func(r pgx.Rows) error {
			var sku string
			var a, res, sold int64
			if err := r.Scan(&sku, &a, &res, &sold); err != nil {
				return err
			}
			s := get(sku)
			s.Available, s.Reserved, s.Sold = a, res, sold
			st.SKUs[sku] = s
			return nil
		}},
		{p.q.verifyLedger, func(r pgx.Rows) error {
			var sku, kind string
			var n int64
			if err := r.Scan(&sku, &kind, &n); err != nil {
				return err
			}
			s := get(sku)
			s.Ledger[kind] = n
			st.SKUs[sku] = s
			return nil
		}},
		{p.q.verifyKeys, func(r pgx.Rows) error {
			var sku string
			var ops, keys int64
			if err := r.Scan(&sku, &ops, &keys); err != nil {
				return err
			}
			s := get(sku)
			s.Operations, s.DistinctKeys = ops, keys
			st.SKUs[sku] = s
			return nil
		}},
		{p.q.verifyEnds, func(r pgx.Rows) error {
			var sku string
			var extra int64
			if err := r.Scan(&sku, &extra); err != nil {
				return err
			}
			s := get(sku)
			s.ExtraEnds = extra
			st.SKUs[sku] = s
			return nil
		}},
		{p.q.verifyRowBalance, func(r pgx.Rows) error {
			var sku string
			var idx int32
			var wantA, a, wantR, res, wantS, sold int64
			if err := r.Scan(&sku, &idx, &wantA, &a, &wantR, &res, &wantS, &sold); err != nil {
				return err
			}
			for _, c := range []struct {
				what      string
				want, got int64
			}{{"available", wantA, a}, {"reserved", wantR, res}, {"sold", wantS, sold}} {
				if c.want != c.got {
					add(sku, loadgen.Discrepancy{Check: "ledger_balance", Shard: idx,
						Detail: c.what + ": opening balance plus ledger against the row", Expected: c.want, Actual: c.got})
				}
			}
			return nil
		}},
		{p.q.verifyHolds, func(r pgx.Rows) error {
			var sku string
			var idx int32
			var held, res int64
			if err := r.Scan(&sku, &idx, &held, &res); err != nil {
				return err
			}
			add(sku, loadgen.Discrepancy{Check: "reserved_holds", Shard: idx,
				Detail: "held reservations against the row's reserved", Expected: held, Actual: res})
			return nil
		}},
	}
	if p.mode != modeNaive {
		checks = append(checks, struct {
			sql  string
			scan func(pgx.Rows) error
		}{p.q.verifyOpsWithoutLedger, func(r pgx.Rows) error {
			var sku string
			var n int64
			if err := r.Scan(&sku, &n); err != nil {
				return err
			}
			add(sku, loadgen.Discrepancy{Check: "operation_ledger", Detail: "operations without exactly one ledger entry", Actual: n})
			return nil
		}}, struct {
			sql  string
			scan func(pgx.Rows) error
		}{p.q.verifyLedgerWithoutOp, func(r pgx.Rows) error {
			var sku string
			var n int64
			if err := r.Scan(&sku, &n); err != nil {
				return err
			}
			add(sku, loadgen.Discrepancy{Check: "operation_ledger", Detail: "ledger entries without an operation", Actual: n})
			return nil
		}})
	}
	for _, c := range checks {
		if err := each(c.sql, c.scan); err != nil {
			return loadgen.State{}, fmt.Errorf("baseline: %s: verify: %w", p.Name(), err)
		}
	}
	return st, nil
}

// take is one transaction of baselines (2) and (3): record the key, take
// the stock from the first row (starting at the key's) that has enough,
// write the reservation and the ledger row, commit. A refusal for stock
// rolls back, so the key stays free for a later retry.
func (p *Postgres) take(ctx context.Context, kind stock.OpKind, sku, key string, qty int64) (string, loadgen.Outcome) {
	n, ok := p.rows[sku]
	if !ok {
		return "", loadgen.Error(string(stock.CodeSKUNotFound))
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return "", outcomeOf(ctx, err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	var resID *string
	if kind == stock.OpReserve {
		id := newReservationID(sku)
		resID = &id
	}
	tag, err := tx.Exec(ctx, p.q.insertOp, sku, key, string(kind), qty, resID)
	if err != nil {
		return "", outcomeOf(ctx, err)
	}
	if tag.RowsAffected() == 0 {
		// The key is taken: by a committed operation, or by one that
		// committed while this INSERT waited on the unique index.
		return p.replay(ctx, tx, kind, sku, key, qty)
	}
	update := p.q.deductRow
	if kind == stock.OpReserve {
		update = p.q.reserveRow
	}
	start := keyHash(key) % uint32(n)
	for i := range uint32(n) {
		idx := int32((start + i) % uint32(n))
		tag, err := tx.Exec(ctx, update, sku, idx, qty)
		if err != nil {
			return "", outcomeOf(ctx, err)
		}
		if tag.RowsAffected() == 0 {
			continue // not enough here: try the next row
		}
		dA, dR, dS := -qty, int64(0), qty
		if kind == stock.OpReserve {
			dR, dS = qty, 0
			if _, err := tx.Exec(ctx, p.q.insertReservation, *resID, sku, idx, qty, key); err != nil {
				return "", outcomeOf(ctx, err)
			}
		}
		if _, err := tx.Exec(ctx, p.q.insertLedger, sku, idx, string(kind), qty, key, resID, dA, dR, dS); err != nil {
			return "", outcomeOf(ctx, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return "", outcomeOf(ctx, err)
		}
		if resID != nil {
			return *resID, loadgen.OK
		}
		return "", loadgen.OK
	}
	return "", loadgen.OutOfStock
}

// replay answers a request whose key is already recorded with the first
// result, or IDEMPOTENCY_KEY_REUSED when the parameters differ.
func (p *Postgres) replay(ctx context.Context, tx pgx.Tx, kind stock.OpKind, sku, key string, qty int64) (string, loadgen.Outcome) {
	var k, resID string
	var q int64
	if err := tx.QueryRow(ctx, p.q.selectOp, sku, key).Scan(&k, &q, &resID); err != nil {
		return "", outcomeOf(ctx, err)
	}
	if k != string(kind) || q != qty {
		return "", loadgen.Error(string(stock.CodeIdempotencyKeyReused))
	}
	return resID, loadgen.Replayed
}

// end commits or releases a reservation in one transaction; the guarded
// state change makes a second commit or release a replay.
func (p *Postgres) end(ctx context.Context, kind stock.OpKind, id string) loadgen.Outcome {
	state, move := stock.ReservationCommitted, p.q.commitStock
	if kind == stock.OpRelease {
		state, move = stock.ReservationReleased, p.q.releaseStock
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return outcomeOf(ctx, err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	var sku, key string
	var idx int32
	var qty int64
	err = tx.QueryRow(ctx, p.q.endReservation, id, string(state)).Scan(&sku, &idx, &qty, &key)
	if errors.Is(err, pgx.ErrNoRows) {
		var cur string
		err = tx.QueryRow(ctx, p.q.selectReservation, id).Scan(&sku, &idx, &qty, &key, &cur)
		if errors.Is(err, pgx.ErrNoRows) {
			return loadgen.Error(string(stock.CodeReservationNotFound))
		}
		if err != nil {
			return outcomeOf(ctx, err)
		}
		return endedOutcome(state, stock.ReservationState(cur))
	}
	if err != nil {
		return outcomeOf(ctx, err)
	}
	if _, err := tx.Exec(ctx, move, sku, idx, qty); err != nil {
		return outcomeOf(ctx, err)
	}
	dA, dS := int64(0), qty
	if kind == stock.OpRelease {
		dA, dS = qty, 0
	}
	if _, err := tx.Exec(ctx, p.q.insertLedger, sku, idx, string(kind), qty, key, id, dA, -qty, dS); err != nil {
		return outcomeOf(ctx, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return outcomeOf(ctx, err)
	}
	return loadgen.OK
}

// endedOutcome answers a commit (want committed) or release (want released)
// of a reservation already in state cur.
func endedOutcome(want, cur stock.ReservationState) loadgen.Outcome {
	switch {
	case cur == want:
		return loadgen.Replayed
	case cur == stock.ReservationCommitted:
		return loadgen.Error(string(stock.CodeReservationAlreadyCommitted))
	case cur == stock.ReservationReleased:
		return loadgen.Error(string(stock.CodeReservationAlreadyReleased))
	}
	return loadgen.Error(string(stock.CodeReservationNotFound))
}

// outcomeOf classifies a failed statement: the context's end, else the
// Postgres error code (PG_40001, ...), else UNAVAILABLE. None is definite:
// a failed COMMIT may have committed.
func outcomeOf(ctx context.Context, err error) loadgen.Outcome {
	if o, ok := loadgen.ErrorFromContext(ctx); ok {
		return o
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return loadgen.Outcome{Status: loadgen.StatusError, Code: "PG_" + pgErr.Code, Detail: pgErr.Message}
	}
	return loadgen.Outcome{Status: loadgen.StatusError, Code: loadgen.CodeUnavailable, Detail: err.Error()}
}

func keyHash(key string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()
}

func newReservationID(sku string) string { return sku + "." + randomHex(12) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
