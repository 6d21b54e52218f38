-- +goose Up
-- The rebalancer.
--
-- shard_span: shards 0..shard_span-1 may hold stock. SetShards changes
-- shards (the shards in service, which take new reserves and deducts);
-- shrinking leaves shard_span where it was until the shards being retired
-- (shards..shard_span-1) have had their stock moved away and their
-- reservations ended, then the rebalancer sets it to shards. The partial
-- index finds the SKUs with shards still being retired.
ALTER TABLE skus ADD COLUMN shard_span int;
UPDATE skus SET shard_span = shards;
ALTER TABLE skus ALTER COLUMN shard_span SET NOT NULL;
ALTER TABLE skus ADD CONSTRAINT skus_shard_span CHECK (shard_span >= shards AND shard_span <= 256);
CREATE INDEX skus_retiring ON skus (sku) WHERE shard_span > shards;

-- The highest rebalance-lease token seen per SKU (the etcd lease key's
-- revision), like the partitions' epochs: a mover raises it when it takes
-- a SKU's lease; a transfer is created only with a token at least this
-- high, and the source's writer debits only such a transfer (it locks this
-- row FOR SHARE in the step), so a mover whose lease has gone can neither
-- start nor step a move once a newer one took over.
CREATE TABLE move_fences (
    sku         text PRIMARY KEY REFERENCES skus (sku),
    token       bigint NOT NULL CHECK (token > 0),
    holder      text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE move_fences;
DROP INDEX skus_retiring;
ALTER TABLE skus DROP CONSTRAINT skus_shard_span;
ALTER TABLE skus DROP COLUMN shard_span;
