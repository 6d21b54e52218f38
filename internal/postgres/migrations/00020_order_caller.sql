-- +goose Up
-- Who placed each order: the caller's role and credential id (never a
-- secret), as in ledger.caller. Every line's ledger entries name it,
-- those a recovery in another process writes too, which has nothing else
-- to take it from. Empty for orders placed before it was recorded. A
-- constant default rewrites no row.
ALTER TABLE orders ADD COLUMN caller text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE orders DROP COLUMN caller;
