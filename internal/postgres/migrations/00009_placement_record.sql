-- +goose Up
-- The placement of SKUs on databases as this database last recorded it,
-- and the placement lock's fence. etcd holds the placement, but etcd can
-- lose it (the key deleted, a restore from an older snapshot); each
-- database keeps the newest version it was given, so that a process
-- that finds etcd's placement missing or older restores it instead of
-- starting again from version 1 (which would strand SKUs placed by later
-- versions and create their names again elsewhere).
--
-- fence is the highest placement-lock token (the etcd revision at which
-- the lock was taken) that a CreateSku or SetPlacement has shown this
-- database: each raises it in every database before it looks for the
-- SKU's name, and its insert checks it, so a holder that lost the lock
-- (paused past its lease) can no longer create a SKU once a newer holder
-- has looked.
CREATE TABLE placement_record (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    version     bigint NOT NULL DEFAULT 0 CHECK (version >= 0),
    placement   jsonb,
    fence       bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO placement_record DEFAULT VALUES;

-- +goose Down
DROP TABLE placement_record;
