-- +goose Up
-- The sale window (UpdateSku sale_start, sale_end): batches refuse reserves
-- and deducts outside it by their transaction's now(). NULL: no bound.
ALTER TABLE skus ADD COLUMN sale_start timestamptz, ADD COLUMN sale_end timestamptz,
	ADD CONSTRAINT skus_sale_window CHECK (sale_end > sale_start);
-- ListSkus pages by name in byte order, whatever the database's collation,
-- so that pages merged from several databases interleave exactly.
CREATE INDEX skus_sku_bytes ON skus (sku COLLATE "C");

-- +goose Down
DROP INDEX skus_sku_bytes;
ALTER TABLE skus DROP CONSTRAINT skus_sale_window, DROP COLUMN sale_start, DROP COLUMN sale_end;
