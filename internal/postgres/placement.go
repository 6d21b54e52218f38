package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// ErrPlacementFenced: a newer holder of the placement lock has shown this
// database a higher fence; the caller's lock is gone.
var ErrPlacementFenced = errors.New("postgres: fenced: the placement lock was taken by a newer holder")

// RecordedPlacement returns the placement this database recorded (no
// version if none yet) and the placement lock's fence it has seen.
func (db *DB) RecordedPlacement(ctx context.Context) (stock.Placement, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var raw []byte
	var fence int64
	if err := db.pool.QueryRow(ctx, `SELECT placement, fence FROM placement_record`).Scan(&raw, &fence); err != nil {
		return stock.Placement{}, 0, fmt.Errorf("postgres: recorded placement: %w", err)
	}
	p, err := decodePlacement(raw)
	return p, fence, err
}

// decodePlacement decodes a recorded placement; NULL is none.
func decodePlacement(raw []byte) (stock.Placement, error) {
	var p stock.Placement
	if raw == nil {
		return p, nil
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, fmt.Errorf("postgres: recorded placement: %w", err)
	}
	if err := p.Check(); err != nil {
		return p, fmt.Errorf("postgres: recorded placement: %w", err)
	}
	return p, nil
}

// RecordPlacement records p unless the database recorded a version as new
// already (then it does nothing). With fence > 0 (a holder of the
// placement lock publishing p) it raises the database's fence to fence, and
// fails with ErrPlacementFenced if a newer holder raised it higher. With
// fence 0, p is etcd's placement as published already and is recorded
// without a fence: whoever published a version wrote the same one here
// first.
func (db *DB) RecordPlacement(ctx context.Context, p stock.Placement, fence int64) error {
	if err := p.Check(); err != nil {
		return err
	}
	val, err := json.Marshal(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if fence > 0 {
		if err := raisePlacementFence(ctx, tx, fence); err != nil {
			return err
		}
	}
	// As text: a connection in the simple protocol (the fault proxy's
	// tests use it) sends []byte as bytea, which jsonb refuses.
	if _, err := tx.Exec(ctx, `UPDATE placement_record SET version = $1, placement = $2, updated_at = now()
		WHERE version < $1`, p.Version(), string(val)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// raisePlacementFence raises the placement fence to fence in tx, holding
// the row until tx ends, or fails with ErrPlacementFenced if it is higher.
func raisePlacementFence(ctx context.Context, tx pgx.Tx, fence int64) error {
	// FOR UPDATE waits for any other holder's transaction on the row and
	// then reads its latest committed version.
	var cur int64
	if err := tx.QueryRow(ctx, `SELECT fence FROM placement_record FOR UPDATE`).Scan(&cur); err != nil {
		return err
	}
	if cur > fence {
		return fmt.Errorf("%w (fence %d, asked %d)", ErrPlacementFenced, cur, fence)
	}
	if cur == fence {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE placement_record SET fence = $1, updated_at = now()`, fence)
	return err
}

// ClaimPlacement shows the database the placement lock's fence (raising
// the recorded fence to it, or ErrPlacementFenced if a newer holder has
// raised it higher) and then, in the same transaction, reads the recorded
// placement and whether the database holds a SKU named sku ("": not
// asked). The fence is raised before the name is looked for, and a fenced
// insert (CreateSKUFenced) holds the row while it runs, so a holder that
// claims after another's fenced insert sees that SKU, and one whose lock
// was lost before it inserts is refused.
func (db *DB) ClaimPlacement(ctx context.Context, fence int64, sku string) (stock.Placement, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return stock.Placement{}, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := raisePlacementFence(ctx, tx, fence); err != nil {
		return stock.Placement{}, false, err
	}
	// Read committed: this statement's snapshot is taken after the UPDATE
	// above waited for any fenced insert, so it sees that insert's SKU.
	var raw []byte
	var has bool
	if err := tx.QueryRow(ctx, `SELECT placement, EXISTS (SELECT 1 FROM skus WHERE sku = $1) FROM placement_record`, sku).
		Scan(&raw, &has); err != nil {
		return stock.Placement{}, false, err
	}
	p, err := decodePlacement(raw)
	if err != nil {
		return p, false, err
	}
	return p, has, tx.Commit(ctx)
}

// HighestFence is the highest etcd revision this database has recorded as
// a fence: a partition's epoch, a SKU's move-lease token or the placement
// lock's token. An etcd whose revision is below it (restored from an
// older snapshot without --bump-revision, or rebuilt empty) would hand out
// epochs and tokens that this database refuses.
func (db *DB) HighestFence(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT greatest(
		(SELECT coalesce(max(epoch), 0) FROM partitions),
		(SELECT coalesce(max(token), 0) FROM move_fences),
		(SELECT fence FROM placement_record))`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("postgres: highest fence: %w", err)
	}
	return n, nil
}
