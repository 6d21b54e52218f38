package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardstock/shardstock/internal/stock"
)

// CreateSKU creates a SKU and its shards, spreading initial stock over them
// (the first initial%shards shards get one unit more). The shards' opening
// balances are what reconciliation starts from.
func (db *DB) CreateSKU(ctx context.Context, s stock.SKU, initial int64) error {
	return db.createSKU(ctx, s, initial, 0, false)
}

// CreateSKUFenced is CreateSKU by a holder of the placement lock whose
// fence is fence: it fails with ErrPlacementFenced if a newer holder has
// shown this database a higher one (ClaimPlacement), and holds the fence
// row until it commits, so that a newer holder's claim waits for it and
// then sees the SKU.
func (db *DB) CreateSKUFenced(ctx context.Context, s stock.SKU, initial, fence int64) error {
	return db.createSKU(ctx, s, initial, fence, true)
}

func (db *DB) createSKU(ctx context.Context, s stock.SKU, initial, fence int64, fenced bool) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if fenced {
		var cur int64
		if err := tx.QueryRow(ctx, `SELECT fence FROM placement_record FOR SHARE`).Scan(&cur); err != nil {
			return err
		}
		if cur > fence {
			return fmt.Errorf("%w (fence %d, asked %d)", ErrPlacementFenced, cur, fence)
		}
	}
	ad := s.Admission
	_, err = tx.Exec(ctx, `INSERT INTO skus (sku, status, shards, shard_span, max_per_order, customer_limit, reservation_ttl_ms, sale_start, sale_end,
			max_hold_ms, one_per_order, admission_mode, token_ttl_ms, waitlist_max, tokens_per_customer, draw_at)
		VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`, s.Name, string(s.Status), s.Shards, s.MaxPerOrder, s.CustomerLimit,
		s.ReservationTTL.Milliseconds(), nullTime(s.SaleStart), nullTime(s.SaleEnd), s.MaxHold.Milliseconds(), s.OnePerOrder,
		string(ad.Mode), ad.TokenTTL.Milliseconds(), ad.WaitlistMax, ad.TokensPerCustomer, nullTime(ad.DrawAt))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return stock.Errorf(stock.CodeSKUExists, "sku %q already exists", s.Name)
	}
	if err := windowError(err); err != nil {
		return err
	}
	idx, part, avail := make([]int32, s.Shards), make([]int32, s.Shards), make([]int64, s.Shards)
	for i := range s.Shards {
		idx[i], part[i] = i, stock.PartitionOf(s.Name, i)
		avail[i] = initial / int64(s.Shards)
		if int64(i) < initial%int64(s.Shards) {
			avail[i]++
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shards (sku, idx, partition, available, reserved, sold, opening_available)
		SELECT $1, i, p, a, 0, 0, a FROM unnest($2::int[], $3::int[], $4::bigint[]) AS u(i, p, a)`, s.Name, idx, part, avail); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// GetSKU reads a SKU's configuration.
func (db *DB) GetSKU(ctx context.Context, sku string) (*stock.SKU, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	s, err := scanSKU(db.pool.QueryRow(ctx, sqlSelectSKU+` = $1`, sku))
	if isNoRows(err) {
		return nil, stock.Errorf(stock.CodeSKUNotFound, "no sku %q", sku)
	}
	return s, err
}

// GetSKUs reads the configurations of names, one probe each in one
// statement; a SKU the database does not have is left out of the map.
func (db *DB) GetSKUs(ctx context.Context, names []string) (map[string]*stock.SKU, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return collectSKUs(db.pool.Query(ctx, `SELECT s.* FROM (SELECT unnest($1::text[]) AS sku) AS k CROSS JOIN LATERAL (`+sqlSelectSKU+` = k.sku) s`, names))
}

// UpdateSKU applies u and returns the SKU as it now is. Writers read the SKU
// in every batch, so a pause holds for every batch that starts after this
// commits.
func (db *DB) UpdateSKU(ctx context.Context, sku string, u stock.SKUUpdate) (*stock.SKU, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var status *string
	if u.Paused != nil {
		st := string(stock.StatusActive)
		if *u.Paused {
			st = string(stock.StatusPaused)
		}
		status = &st
	}
	var ttl *int64
	if u.TTL != nil {
		ms := u.TTL.Milliseconds()
		ttl = &ms
	}
	var hold *int64
	if u.MaxHold != nil {
		ms := u.MaxHold.Milliseconds()
		hold = &ms
	}
	var mode *string
	var tokenTTL, waitMax, perCustomer *int64
	var drawAt *time.Time
	if a := u.Admission; a != nil {
		m, ms := string(a.Mode), a.TokenTTL.Milliseconds()
		mode, tokenTTL, waitMax, perCustomer, drawAt = &m, &ms, &a.WaitlistMax, &a.TokensPerCustomer, nullTime(a.DrawAt)
	}
	// The window: $7 clears both bounds, then $8 and $9 set theirs. A
	// batch reads the row in its transaction (or checks it, speculating),
	// so the new window holds for every batch that starts after this
	// commits, on every shard server, by the database's clock.
	s, err := scanSKU(db.pool.QueryRow(ctx, `UPDATE skus SET status = coalesce($2, status),
		max_per_order = coalesce($3, max_per_order), customer_limit = coalesce($4, customer_limit),
		reservation_ttl_ms = coalesce($5, reservation_ttl_ms), auto_shards = coalesce($6, auto_shards),
		sale_start = coalesce($8, CASE WHEN $7 THEN NULL ELSE sale_start END),
		sale_end = coalesce($9, CASE WHEN $7 THEN NULL ELSE sale_end END),
		max_hold_ms = coalesce($10, max_hold_ms), one_per_order = coalesce($11, one_per_order),
		admission_mode = coalesce($12, admission_mode), token_ttl_ms = coalesce($13, token_ttl_ms),
		waitlist_max = coalesce($14, waitlist_max), tokens_per_customer = coalesce($15, tokens_per_customer),
		draw_at = CASE WHEN $12::text IS NULL THEN draw_at ELSE $16 END, updated_at = now()
		WHERE sku = $1 RETURNING `+sqlSKUColumns,
		sku, status, u.MaxPerOrder, u.CustomerLimit, ttl, u.AutoShards, u.ClearSaleWindow, u.SaleStart, u.SaleEnd, hold, u.OnePerOrder,
		mode, tokenTTL, waitMax, perCustomer, drawAt))
	if isNoRows(err) {
		return nil, stock.Errorf(stock.CodeSKUNotFound, "no sku %q", sku)
	}
	if err := windowError(err); err != nil {
		return nil, err
	}
	return s, nil
}

// windowError names a sale window whose end is not after its start (the
// CHECK skus_sale_window) as the caller's mistake; other errors pass.
func windowError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.ConstraintName == "skus_sale_window" {
		return stock.Errorf(stock.CodeInvalidArgument, "sale_end must come after sale_start")
	}
	return err
}

// SKUs returns up to limit SKU names above after, in order.
func (db *DB) SKUs(ctx context.Context, after string, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT sku FROM skus WHERE sku COLLATE "C" > $1 ORDER BY sku COLLATE "C" LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ListSKUs returns up to limit SKUs that f selects with names above after,
// in byte order of their names (the order dbset merges several databases
// in, whatever each database's collation), each with its counts summed
// over its shards and its stock in transit.
func (db *DB) ListSKUs(ctx context.Context, f stock.SKUFilter, after string, limit int) ([]stock.SKUSummary, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT `+sqlSKUColumns+`, c.available, c.reserved, c.sold, t.in_transit
		FROM (SELECT `+sqlSKUColumns+` FROM skus
			WHERE sku COLLATE "C" > $1 AND sku COLLATE "C" >= $2 AND sku COLLATE "C" < $3 AND ($4 = '' OR status = $4)
			ORDER BY sku COLLATE "C" LIMIT $5) k
		CROSS JOIN LATERAL (SELECT coalesce(sum(s.available), 0)::bigint AS available, coalesce(sum(s.reserved), 0)::bigint AS reserved,
			coalesce(sum(s.sold), 0)::bigint AS sold FROM shards s WHERE s.sku = k.sku) c
		CROSS JOIN LATERAL (SELECT coalesce(sum(quantity), 0)::bigint AS in_transit FROM transfers tr
			WHERE tr.sku = k.sku AND tr.state = 'debited') t
		ORDER BY sku COLLATE "C"`, after, f.Prefix, stock.SKUNameAfterMax(f.Prefix), string(f.Status), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (stock.SKUSummary, error) {
		var out stock.SKUSummary
		var err error
		out.SKU, err = scanSKU(summaryRow{r, &out})
		return out, err
	})
}

// summaryRow scans a listing's row: scanSKU's columns, then the counts.
type summaryRow struct {
	pgx.Row
	out *stock.SKUSummary
}

func (r summaryRow) Scan(dest ...any) error {
	return r.Row.Scan(append(dest, &r.out.Total.Available, &r.out.Total.Reserved, &r.out.Total.Sold, &r.out.InTransit)...)
}
