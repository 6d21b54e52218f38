-- +goose Up
-- Two things reconciliation needs that no clock can give.
--
-- 1. Which operations and reservation ends come after a checkpoint.
-- Every write group (internal/postgres, groupedPart) takes one number of
-- write_group_seq and stamps it on the operations it inserts, the
-- reservations it ends and the checkpoints it writes. One shard's groups
-- run one after another (its one writer; a takeover waits for the old
-- owner's group, fenced), and each takes its number before it commits, so
-- a later group of a shard has a higher number: an operation is after a
-- checkpoint of its shard if and only if its group_seq is higher. A
-- timestamp could not say so: a speculative group dates its operations by
-- its process's clock, and clocks step. The sequence caches nothing
-- (CACHE 1), so numbers go out in the order they are asked for whichever
-- backend asks.
--
-- Operations written before this migration have 0: before every
-- checkpoint written after it, and not after those written before it (0
-- too), whose entries pair them by key instead. An operation or a
-- checkpoint inserted by hand (a test, a repair) takes a new number: it
-- counts as written now. A reservation ended by no group (before this
-- migration, or by hand) keeps 0, and is after a checkpoint if the
-- database's clock dates it so, as before (reservations_ended_ungrouped:
-- the service's ends never enter it).
CREATE SEQUENCE write_group_seq CACHE 1;

ALTER TABLE operations ADD COLUMN group_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE operations ALTER COLUMN group_seq SET DEFAULT nextval('write_group_seq');
ALTER TABLE reservations ADD COLUMN end_group_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE ledger_checkpoints ADD COLUMN group_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE ledger_checkpoints ALTER COLUMN group_seq SET DEFAULT nextval('write_group_seq');

DROP INDEX operations_recent;
CREATE INDEX operations_grouped ON operations (sku, shard, group_seq);
DROP INDEX reservations_ended;
CREATE INDEX reservations_ended ON reservations (sku, shard, end_group_seq) WHERE state <> 'held';
CREATE INDEX reservations_ended_ungrouped ON reservations (sku, shard, ended_at) WHERE state <> 'held' AND end_group_seq = 0;

-- 2. How far the scheduled reconciliation has walked each shard's
-- ledger. A pass checks each shard's tail (after its latest checkpoint)
-- and also walks stretches from one checkpoint to the next, oldest first,
-- a bounded number per pass (internal/ledger, walkStretchesPerPassMax):
-- walked_to is the entry id of the last checkpoint up to which every
-- stretch of the shard has been found sound (0: none yet, the next
-- stretch starts at the shard's opening balance). A stretch found wrong
-- is recorded (unsound_to, the entry id of the checkpoint that ends it,
-- and what was wrong) and not walked past: every reconciliation of the
-- SKU reports it, so the alert stays, until an operator who has repaired
-- the ledger deletes the row (the walk then starts the shard again).
CREATE TABLE ledger_walks (
    sku         text NOT NULL,
    shard       int NOT NULL,
    walked_to   bigint NOT NULL CHECK (walked_to >= 0),
    unsound_to  bigint NOT NULL DEFAULT 0 CHECK (unsound_to >= 0),
    unsound     text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, shard)
);

-- +goose Down
DROP TABLE ledger_walks;
DROP INDEX reservations_ended_ungrouped;
DROP INDEX reservations_ended;
CREATE INDEX reservations_ended ON reservations (sku, shard, ended_at) WHERE state <> 'held';
DROP INDEX operations_grouped;
CREATE INDEX operations_recent ON operations (sku, shard, created_at);
ALTER TABLE ledger_checkpoints DROP COLUMN group_seq;
ALTER TABLE reservations DROP COLUMN end_group_seq;
ALTER TABLE operations DROP COLUMN group_seq;
DROP SEQUENCE write_group_seq;
