-- +goose Up
-- The schema of shardstock. Every count is CHECKed non-negative; the ledger is
-- append-only (a trigger refuses UPDATE and DELETE).

CREATE TABLE skus (
    sku                 text PRIMARY KEY,
    status              text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused')),
    shards              int NOT NULL CHECK (shards BETWEEN 1 AND 256),
    max_per_order       bigint NOT NULL DEFAULT 0 CHECK (max_per_order >= 0),
    customer_limit      bigint NOT NULL DEFAULT 0 CHECK (customer_limit >= 0),
    reservation_ttl_ms  bigint NOT NULL CHECK (reservation_ttl_ms > 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- One sub-row of a SKU's stock. opening_* is the balance the shard was
-- created with; reconciliation checks opening + ledger deltas = row.
CREATE TABLE shards (
    sku                text NOT NULL REFERENCES skus (sku),
    idx                int NOT NULL CHECK (idx >= 0),
    partition          int NOT NULL,
    available          bigint NOT NULL CHECK (available >= 0),
    reserved           bigint NOT NULL CHECK (reserved >= 0),
    sold               bigint NOT NULL CHECK (sold >= 0),
    opening_available  bigint NOT NULL CHECK (opening_available >= 0),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, idx)
);

-- Fencing: the current owner of each partition and its epoch (the etcd
-- ownership key's revision). Every batch locks its row FOR SHARE and checks
-- the epoch; a takeover UPDATEs it, so a zombie's next batch aborts.
CREATE TABLE partitions (
    partition   int PRIMARY KEY,
    owner       text NOT NULL DEFAULT '',
    epoch       bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO partitions (partition) SELECT generate_series(0, 255);

-- The first result of every keyed action. Keys are unique in the database
-- (not only per SKU), so the same key on another SKU is detected as reused.
CREATE TABLE operations (
    idempotency_key  text PRIMARY KEY,
    sku              text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('reserve', 'deduct', 'replenish', 'adjust')),
    params_hash      bytea NOT NULL,
    quantity         bigint NOT NULL,
    shard            int NOT NULL,
    reservation_id   text NOT NULL DEFAULT '',
    order_ref        text NOT NULL DEFAULT '',
    customer_ref     text NOT NULL DEFAULT '',
    result           text NOT NULL DEFAULT 'ok',
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operations_sku ON operations (sku);

CREATE TABLE reservations (
    id               text PRIMARY KEY,
    sku              text NOT NULL,
    shard            int NOT NULL,
    partition        int NOT NULL,
    idempotency_key  text NOT NULL,
    quantity         bigint NOT NULL CHECK (quantity > 0),
    state            text NOT NULL CHECK (state IN ('held', 'committed', 'released', 'expired')),
    expires_at       timestamptz NOT NULL,
    order_ref        text NOT NULL DEFAULT '',
    customer_ref     text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now(),
    ended_at         timestamptz,
    end_reason       text NOT NULL DEFAULT ''
);
CREATE INDEX reservations_due ON reservations (partition, expires_at) WHERE state = 'held';
CREATE INDEX reservations_sku ON reservations (sku, shard) WHERE state = 'held';

-- Units each customer holds or bought of a SKU, for customer_limit.
CREATE TABLE customer_usage (
    sku           text NOT NULL,
    customer_ref  text NOT NULL,
    quantity      bigint NOT NULL CHECK (quantity >= 0),
    PRIMARY KEY (sku, customer_ref)
);

-- The append-only record of every change to every shard.
-- Its key is (sku, id): the one index every write maintains is the one
-- that pages a SKU's ledger; id orders entries (per shard, the apply order).
CREATE TABLE ledger (
    id                bigserial,
    sku               text NOT NULL,
    shard             int NOT NULL,
    kind              text NOT NULL,
    quantity          bigint NOT NULL,
    available_before  bigint NOT NULL,
    available_after   bigint NOT NULL,
    reserved_before   bigint NOT NULL,
    reserved_after    bigint NOT NULL,
    sold_before       bigint NOT NULL,
    sold_after        bigint NOT NULL,
    idempotency_key   text NOT NULL DEFAULT '',
    reservation_id    text NOT NULL DEFAULT '',
    transfer_id       text NOT NULL DEFAULT '',
    order_ref         text NOT NULL DEFAULT '',
    source            text NOT NULL,
    reason            text NOT NULL DEFAULT '',
    approver          text NOT NULL DEFAULT '',
    server_id         text NOT NULL,
    epoch             bigint NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, id)
);

-- +goose StatementBegin
CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger is append-only: % refused', TG_OP;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- Two-phase moves of available stock between two shards of one SKU: the
-- source's owner debits (pending -> debited: the units are in transit), the
-- destination's owner credits (debited -> credited). Each step is ledgered
-- and idempotent by transfer id; a transfer left half-way is completed by
-- the shard servers' sweep. fence_token is the rebalancer lock's revision.
CREATE TABLE transfers (
    id              text PRIMARY KEY,
    sku             text NOT NULL REFERENCES skus (sku),
    from_shard      int NOT NULL,
    to_shard        int NOT NULL,
    from_partition  int NOT NULL,
    to_partition    int NOT NULL,
    quantity        bigint NOT NULL CHECK (quantity > 0),
    state           text NOT NULL CHECK (state IN ('pending', 'debited', 'credited', 'aborted')),
    fence_token     bigint NOT NULL DEFAULT 0,
    reason          text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (from_shard <> to_shard)
);
CREATE INDEX transfers_open ON transfers (state, updated_at) WHERE state IN ('pending', 'debited');
CREATE INDEX transfers_sku ON transfers (sku, created_at);

-- Batch writes check their row counts inside the statement, so that a
-- mismatch aborts the transaction before the COMMIT queued behind it in the
-- same round trip: SS001 is a conflict with a concurrent batch (rerun),
-- SS002 a shard row that is not what its only writer believes (halt).
-- +goose StatementBegin
CREATE FUNCTION shardstock_expect(got bigint, want bigint, what text, code text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s: %s of %s rows', what, got, want);
    END IF;
    RETURN got;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION shardstock_expect;
DROP TABLE ledger;
DROP FUNCTION ledger_append_only;
DROP TABLE transfers;
DROP TABLE customer_usage;
DROP TABLE reservations;
DROP TABLE operations;
DROP TABLE partitions;
DROP TABLE shards;
DROP TABLE skus;
