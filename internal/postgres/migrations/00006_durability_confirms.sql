-- +goose Up
-- A write of a server's own, committed only to learn that the commits
-- before it are as durable as the database's settings make a commit
-- (confirmDurable): with a synchronous standby, its COMMIT returns once the
-- standby holds the WAL up to it, and so every commit visible before it.
-- One row per server, updated in place.
CREATE TABLE durability_confirms (
    server_id     text PRIMARY KEY,
    confirmed_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE durability_confirms;
