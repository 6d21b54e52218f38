-- +goose Up
-- A ticket's reserve key: keyed tickets (every ticket entered from this
-- migration on) reserve with stock.TokenKey of their SKU and request key,
-- the key a token granted directly with no ticket reserves with, so that
-- a request's direct grant and its ticket's admission are one operation
-- to the shards (docs/admission.md, "Direct grants"). Tickets entered
-- before keep stock.TicketKey of their id: a claimed one may hold a
-- reservation under it. The inserts name the column; its default stays
-- false, so that a process from before this migration, still running in
-- a rolling upgrade, enters tickets it admits with the old key.
ALTER TABLE admission_tickets ADD COLUMN keyed boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE admission_tickets DROP COLUMN keyed;
