-- +goose NO TRANSACTION
-- +goose Up
-- The SKUs from before migration 00023 get a version (its trigger draws
-- one at their update), 10,000 at a time in key order, each batch its own
-- transaction: row locks only, which the batches that read skus do not
-- wait for, where one UPDATE of the table held them for its whole length
-- (8.5 s for a million SKUs, docs/operations.md). A start that stops
-- midway leaves the rest at 0, and the next start goes on.
-- +goose StatementBegin
DO $$
DECLARE
	last text := '';
	upper text;
BEGIN
	LOOP
		SELECT max(sku) INTO upper FROM (SELECT sku FROM skus WHERE sku > last ORDER BY sku LIMIT 10000) b;
		EXIT WHEN upper IS NULL;
		-- 00023's trigger draws the version of every row updated.
		UPDATE skus SET version = version WHERE sku > last AND sku <= upper AND version = 0;
		last := upper;
		COMMIT;
	END LOOP;
END;
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 1;
