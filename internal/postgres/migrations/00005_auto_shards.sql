-- +goose Up
-- The per-SKU switch of the automatic split and merge (UpdateSku
-- auto_shards); the allocators' -auto-shards switches it off for all.
ALTER TABLE skus ADD COLUMN auto_shards boolean NOT NULL DEFAULT true;

-- +goose Down
ALTER TABLE skus DROP COLUMN auto_shards;
