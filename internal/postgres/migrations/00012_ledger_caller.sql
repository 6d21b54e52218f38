-- +goose Up
-- Who asked for each change: the caller's role and credential id (never a
-- secret), e.g. 'service:token:3f2a9c1b0d4e' or 'admin:jwt:alice'; empty
-- for shardstock's own work (sweeps, moves) and for entries written before
-- callers were recorded. Adding a column with a constant default rewrites
-- no row, so the append-only triggers do not fire.
ALTER TABLE ledger ADD COLUMN caller text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE ledger DROP COLUMN caller;
