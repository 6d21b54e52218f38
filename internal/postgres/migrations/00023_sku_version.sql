-- +goose Up
-- A SKU's version: a random 63-bit number drawn anew whenever its row is
-- inserted or updated, whatever the column, so that two reads of a SKU
-- with the same version read the same settings. A speculative group checks
-- the version its writer read instead of every setting (postgres.assumedParts):
-- one array for the group's SKUs rather than one per setting.
--
-- Random rather than from a sequence: a sequence can hand out a number
-- again (a restore to an earlier point, a failover that lost writes, a
-- second database), and a process that still holds a read under that
-- number would then match settings it never read. Two draws match by a
-- chance of about 2^-52. 0 is never drawn: it is a SKU not read from
-- storage, which never speculates (speculable). Rows from before get theirs
-- in migration 00024, in batches that hold no lock batches wait behind;
-- until then they keep 0, and their SKUs are not speculated on.
-- +goose StatementBegin
CREATE FUNCTION sku_version_draw() RETURNS bigint LANGUAGE sql VOLATILE AS $$
	SELECT 1 + floor(random() * 9223372036854774784)::bigint
$$;
-- +goose StatementEnd
ALTER TABLE skus ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE skus ALTER COLUMN version SET DEFAULT sku_version_draw();

-- +goose StatementBegin
CREATE FUNCTION skus_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.version := sku_version_draw();
	RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER skus_version BEFORE UPDATE ON skus FOR EACH ROW EXECUTE FUNCTION skus_version();
-- Also under session_replication_role = replica (logical replication's
-- apply, some restores), which skips ordinary triggers.
ALTER TABLE skus ENABLE ALWAYS TRIGGER skus_version;

-- +goose Down
DROP TRIGGER skus_version ON skus;
DROP FUNCTION skus_version();
ALTER TABLE skus DROP COLUMN version;
DROP FUNCTION sku_version_draw();
