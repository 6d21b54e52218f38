-- +goose Up
-- The ledger read in commit order (internal/ledger, Stream; docs/changestream.md).
--
-- xid is the transaction that appended the entry (pg_current_xact_id(),
-- the top-level id, 64 bits with its epoch so it never wraps). A reader
-- takes only entries whose xid is below its statement snapshot's xmin: every
-- transaction below it has ended, so no entry can appear there later, and
-- a reader that remembers the last (xid, id) it delivered misses nothing,
-- whatever order the writers commit in.
--
-- Entries written before this migration read as xid 0: all of them
-- committed before it (ALTER TABLE waits for the transactions that hold the
-- table), so they come first, in id order. The constant default is stored
-- in the catalogue (no rewrite); the new default then applies to new rows.
ALTER TABLE ledger ADD COLUMN xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE ledger ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- The readers' order. Every ledger insert maintains it: the writers' cost
-- of the change stream (docs/benchmarks.md, "The change stream").
CREATE INDEX ledger_commit_order ON ledger (xid, id);

-- +goose Down
DROP INDEX ledger_commit_order;
ALTER TABLE ledger DROP COLUMN xid;
