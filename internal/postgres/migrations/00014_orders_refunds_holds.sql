-- +goose Up
-- Holds that bend, refunds tied to their sale, one per order and action.
--
-- skus.max_hold_ms: the longest a reservation may be held from when it
-- was made, however often ExtendReservation extends it (0: the default,
-- stock.MaxHoldDefault). skus.one_per_order: an order_ref is applied at
-- most once per kind (order_applied).
ALTER TABLE skus ADD COLUMN max_hold_ms bigint NOT NULL DEFAULT 0 CHECK (max_hold_ms >= 0),
    ADD COLUMN one_per_order boolean NOT NULL DEFAULT false;

-- reservations.committed: the units a commit bought; fewer than quantity
-- after a partial commit, which released the rest in the same step. NULL
-- on reservations committed before it existed: all of them.
ALTER TABLE reservations ADD COLUMN committed bigint CHECK (committed > 0 AND committed <= quantity);

-- A refund is an operation of its own, keyed like the others, naming its
-- sale (stock.Sale.ID); its ledger entry names the sale too.
ALTER TABLE operations DROP CONSTRAINT operations_kind_check;
ALTER TABLE operations ADD CONSTRAINT operations_kind_check CHECK (kind IN ('reserve', 'deduct', 'replenish', 'adjust', 'refund'));
ALTER TABLE operations ADD COLUMN original text NOT NULL DEFAULT '';
ALTER TABLE ledger ADD COLUMN original text NOT NULL DEFAULT '';

-- The units refunded of each sale, guarded by what it sold: every refund
-- adds to its sale's row WHERE refunded + q <= sold, so that two refunds
-- of one sale on two shards (two writers) cannot both pass the cap; the
-- one that finds the row moved is rerun and reads it.
CREATE TABLE refunds (
    sku       text NOT NULL,
    sale      text NOT NULL,
    sold      bigint NOT NULL CHECK (sold > 0),
    refunded  bigint NOT NULL CHECK (refunded > 0 AND refunded <= sold),
    PRIMARY KEY (sku, sale)
);

-- The first key that applied an order_ref for a kind, on a SKU with
-- one_per_order: a second key is a unique violation (a conflict: the
-- batch is rerun and its read refuses it ORDER_ALREADY_APPLIED).
CREATE TABLE order_applied (
    sku              text NOT NULL,
    order_ref        text NOT NULL,
    kind             text NOT NULL,
    idempotency_key  text NOT NULL,
    PRIMARY KEY (sku, order_ref, kind)
);

-- Orders: a cart's lines held all or nothing (internal/allocator, order.go).
-- The row is written before the first line is held; its driver holds a
-- lease on it (lease_until) while it works, and a recovery takes over an
-- open order (pending, committing, releasing) whose lease ran out. Orders
-- live in the database named main, whichever databases hold their SKUs.
CREATE TABLE orders (
    id               text PRIMARY KEY,
    idempotency_key  text NOT NULL UNIQUE,
    params_hash      bytea NOT NULL,
    order_ref        text NOT NULL DEFAULT '',
    customer_ref     text NOT NULL DEFAULT '',
    ttl_ms           bigint NOT NULL DEFAULT 0,
    state            text NOT NULL CHECK (state IN ('pending', 'held', 'committing', 'committed', 'releasing', 'released', 'failed')),
    lines            jsonb NOT NULL,
    expires_at       timestamptz,
    reason           text NOT NULL DEFAULT '',
    fail_code        text NOT NULL DEFAULT '',
    fail_sku         text NOT NULL DEFAULT '',
    driver           text NOT NULL,
    lease_until      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_open ON orders (lease_until) WHERE state IN ('pending', 'committing', 'releasing');

-- +goose Down
DROP TABLE orders;
DROP TABLE order_applied;
DROP TABLE refunds;
ALTER TABLE ledger DROP COLUMN original;
ALTER TABLE operations DROP COLUMN original;
DELETE FROM operations WHERE kind = 'refund';
ALTER TABLE operations DROP CONSTRAINT operations_kind_check;
ALTER TABLE operations ADD CONSTRAINT operations_kind_check CHECK (kind IN ('reserve', 'deduct', 'replenish', 'adjust'));
ALTER TABLE reservations DROP COLUMN committed;
ALTER TABLE skus DROP COLUMN one_per_order, DROP COLUMN max_hold_ms;
