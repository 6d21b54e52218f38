-- +goose Up
-- A running balance per shard every ledger.CheckpointEntries entries,
-- written by the shard's writer in the statement that appends the entry it
-- follows (internal/postgres, checkpointPart). Reconciling a SKU and
-- checking a shard after a divergence start at each shard's latest
-- checkpoint and read only the entries after it, however long the ledger.
--
-- entry_id is the last entry the checkpoint covers; available, reserved
-- and sold are the shard's counts after it (that entry's after); received
-- is the shard's opening available plus every replenish and adjust up to
-- it (what conservation needs of the entries before it). created_at is its
-- transaction's: the operations and reservation ends after the checkpoint
-- are those of later transactions.
--
-- Like the ledger, checkpoints are append-only: a trigger refuses UPDATE,
-- DELETE and TRUNCATE, and the service role is granted none of them.
CREATE TABLE ledger_checkpoints (
    sku         text NOT NULL,
    shard       int NOT NULL,
    entry_id    bigint NOT NULL,
    available   bigint NOT NULL,
    reserved    bigint NOT NULL,
    sold        bigint NOT NULL,
    received    bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, shard, entry_id)
);
CREATE TRIGGER ledger_checkpoints_append_only BEFORE UPDATE OR DELETE ON ledger_checkpoints
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_checkpoints_no_truncate BEFORE TRUNCATE ON ledger_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- A shard's entries after its checkpoint, without reading its siblings'
-- (the key (sku, id) interleaves a SKU's shards). Every ledger insert
-- maintains it: the price of a bounded read.
CREATE INDEX ledger_shard ON ledger (sku, shard, id);

-- A SKU's operations after a checkpoint's time (reconciliation pairs
-- them with the entries after the checkpoint).
CREATE INDEX operations_recent ON operations (sku, shard, created_at);

-- A SKU's reservations ended after a checkpoint's time (reconciliation
-- pairs them with the end entries after the checkpoint). An end already
-- updates every index of its row (its state is in the partial indexes'
-- predicates): this one adds an entry to them.
CREATE INDEX reservations_ended ON reservations (sku, shard, ended_at) WHERE state <> 'held';

-- A SKU's transfer entries (reconciliation pairs each transfer with its
-- steps, whenever they were): partial, so that other entries, nearly all
-- of them, do not maintain it.
CREATE INDEX ledger_transfers ON ledger (sku, transfer_id) WHERE transfer_id <> '';

-- Every shard with entries starts at a checkpoint after its last one, so
-- that no writer's first checkpoint has to sum a long ledger in its write
-- statement: this one read of the whole ledger is the migration's.
INSERT INTO ledger_checkpoints (sku, shard, entry_id, available, reserved, sold, received)
SELECT l.sku, l.shard, l.id, l.available_after, l.reserved_after, l.sold_after, s.opening_available + t.inflow
FROM (SELECT sku, shard, max(id) AS id,
        coalesce(sum(available_after - available_before) FILTER (WHERE kind IN ('replenish', 'adjust')), 0) AS inflow
    FROM ledger GROUP BY sku, shard) t
JOIN ledger l ON l.sku = t.sku AND l.id = t.id
JOIN shards s ON s.sku = t.sku AND s.idx = t.shard;

-- +goose Down
DROP INDEX reservations_ended;
DROP INDEX ledger_transfers;
DROP INDEX operations_recent;
DROP INDEX ledger_shard;
DROP TABLE ledger_checkpoints;
