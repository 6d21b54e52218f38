-- +goose Up
-- A SKU's version: a number drawn from one sequence whenever its row is
-- inserted or updated, whatever the column, so that two reads of a SKU
-- with the same version read the same settings. A speculative group checks
-- the version its writer read instead of every setting (postgres.assumedParts):
-- one array for the group's SKUs rather than one per setting. Rows from
-- before this migration keep version 0 until their next update (no table
-- rewrite); a version is never drawn twice, so 0 is never seen again for a
-- SKU that changed.
CREATE SEQUENCE sku_versions;
-- Each database starts its versions at a random point of 2^46, so that a
-- SKU's version read in one database (a seed taken during a move between
-- databases) is not another database's version of it but by a chance of
-- about the updates made over 2^46.
SELECT setval('sku_versions', 1 + floor(random() * 70368744177664)::bigint);
ALTER TABLE skus ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE skus ALTER COLUMN version SET DEFAULT nextval('sku_versions');

-- +goose StatementBegin
CREATE FUNCTION skus_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.version := nextval('sku_versions');
	RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER skus_version BEFORE UPDATE ON skus FOR EACH ROW EXECUTE FUNCTION skus_version();

-- +goose Down
DROP TRIGGER skus_version ON skus;
DROP FUNCTION skus_version();
ALTER TABLE skus DROP COLUMN version;
DROP SEQUENCE sku_versions;
