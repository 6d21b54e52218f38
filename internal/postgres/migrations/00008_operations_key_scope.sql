-- +goose Up
-- An operation is identified by (sku, idempotency_key), as the brief and
-- the API say (GetOperation takes both): the same key on two SKUs is two
-- operations, in one database or in two. 00001 keyed operations by the key
-- alone, so the same key on another SKU of the same database was refused
-- IDEMPOTENCY_KEY_REUSED while on a SKU of another database it made a new
-- operation: two scopes, depending on where the SKUs were placed.
--
-- Existing rows need no change: their keys are unique alone, hence unique
-- with their SKU. The index is built under the table's lock, in the
-- migration's transaction, so a failure leaves the old key in place.
--
-- sku first: the key serves every lookup (one SKU's keys) and also the
-- lookups by SKU alone that operations_sku served (reconciliation), so
-- that index goes: every insert maintains one index, as wide as the two
-- columns, instead of two.
ALTER TABLE operations DROP CONSTRAINT operations_pkey;
ALTER TABLE operations ADD CONSTRAINT operations_pkey PRIMARY KEY (sku, idempotency_key);
DROP INDEX operations_sku;

-- +goose Down
-- Fails (unique violation) once a key is recorded on two SKUs: going back
-- would have to drop one of the two operations.
CREATE INDEX operations_sku ON operations (sku);
ALTER TABLE operations DROP CONSTRAINT operations_pkey;
ALTER TABLE operations ADD CONSTRAINT operations_pkey PRIMARY KEY (idempotency_key);
