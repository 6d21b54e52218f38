-- +goose Up
-- How a shard server learns the outcome of a COMMIT whose answer it lost.
-- Every group transaction inserts one mark with an id of its own (random,
-- made by the server before the transaction), in the same transaction as
-- its writes: the mark is durable if and only if the batch committed. To
-- learn a lost commit's outcome the server inserts the same id again, as a
-- void, on a new connection: the insert waits while the old transaction is
-- still running; it conflicts if that transaction committed; and if it did
-- not, the void is committed in its place, so that it never can. A crash
-- keeps exactly the marks whose commits reached the WAL. Transaction ids
-- are no use here: Postgres hands out again, after a crash, the ids that
-- never reached its WAL.
--
-- id starts with the creation time in milliseconds (big-endian), so the
-- primary key orders marks by age and pruning reads a range of it.
CREATE TABLE commit_marks (
    id          uuid PRIMARY KEY,
    server_id   text NOT NULL,
    voided      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE commit_marks;
