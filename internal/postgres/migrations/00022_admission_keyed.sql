-- +goose Up
-- Direct grants (docs/admission.md, "Direct grants"): a RequestToken that
-- finds units free and no ticket queued reserves its token at once, with
-- no ticket, under a key derived from its own (stock.TokenKey).

-- A ticket's reserve key: keyed tickets (every ticket entered from this
-- migration on) reserve with stock.TokenKey of their SKU and request key,
-- the key a token granted directly reserves with, so that a request's
-- direct grant and its ticket's admission are one operation to the
-- shards. Tickets entered before keep stock.TicketKey of their id: a
-- claimed one may hold a reservation under it. The inserts name the
-- column; its default stays false, so that a process from before this
-- migration, still running in a rolling upgrade, enters tickets that it
-- admits with the old key.
ALTER TABLE admission_tickets ADD COLUMN keyed boolean NOT NULL DEFAULT false;

-- A SKU has an admission_counts row once it has had a ticket: the row is
-- inserted (and committed) before a SKU's first ticket is entered, and
-- never deleted (the counts' trigger only moves its numbers). An allocator
-- that read no row may grant tokens directly without reading the tickets
-- for stock.DirectTrustMax after its read began, and the first ticket is
-- entered only after that time and stock.DirectTrustMargin have passed
-- (postgres.flagTicketed). The rows of the SKUs with tickets from before:
INSERT INTO admission_counts (sku)
SELECT DISTINCT sku FROM admission_tickets ORDER BY sku
ON CONFLICT (sku) DO NOTHING;

-- +goose Down
ALTER TABLE admission_tickets DROP COLUMN keyed;
