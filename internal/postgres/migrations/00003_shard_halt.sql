-- +goose Up
-- A shard whose row disagrees with its ledger is halted: its writer refuses
-- every write until an operator, having looked, resumes it (AdminService.
-- ResumeShard). The reason lives on the row, so that it outlives the
-- process that found it: a new owner of the partition stays halted too,
-- and GetStock shows why.
ALTER TABLE shards ADD COLUMN halted_reason text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE shards DROP COLUMN halted_reason;
