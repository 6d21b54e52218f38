-- +goose Up
-- A SKU's tickets queued (waiting, or claimed by a worker) and the units
-- asked for by its requests in flight (pending, not claimed), kept by the
-- statements that change its tickets (admission_counts_apply), so that an
-- entry batch, the waitlist's length and a worker's pass read one row
-- instead of counting every open ticket of the SKU: an entry batch counted
-- them twice, before and under the SKU's lock, which grew with the
-- waitlist (docs/admission.md).
CREATE TABLE admission_counts (
	sku text PRIMARY KEY,
	-- No CHECK (>= 0): an INSERT ... ON CONFLICT checks the row it
	-- proposes, a negative change, before it turns into the UPDATE.
	queued bigint NOT NULL DEFAULT 0,
	in_flight bigint NOT NULL DEFAULT 0
);

-- Once per statement, from its transition tables: each SKU's counts move
-- by what its new rows count less what its old rows did. The SKUs' rows
-- are inserted or updated in SKU order, so that two statements that change
-- the tickets of several SKUs (the admitted marks) cannot deadlock on them
-- (every DELETE is of one ticket).
-- +goose StatementBegin
CREATE FUNCTION admission_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO admission_counts AS c (sku, queued, in_flight)
		SELECT sku, sum(queued), sum(in_flight) FROM (
			SELECT sku, (state = 'waiting' OR state = 'pending' AND claimed_at IS NOT NULL)::int AS queued,
				CASE WHEN state = 'pending' AND claimed_at IS NULL THEN quantity ELSE 0 END AS in_flight
			FROM new_rows) AS d
		GROUP BY sku HAVING sum(queued) <> 0 OR sum(in_flight) <> 0 ORDER BY sku
		ON CONFLICT (sku) DO UPDATE SET queued = c.queued + excluded.queued, in_flight = c.in_flight + excluded.in_flight;
	ELSIF TG_OP = 'UPDATE' THEN
		INSERT INTO admission_counts AS c (sku, queued, in_flight)
		SELECT sku, sum(queued), sum(in_flight) FROM (
			SELECT sku, (state = 'waiting' OR state = 'pending' AND claimed_at IS NOT NULL)::int AS queued,
				CASE WHEN state = 'pending' AND claimed_at IS NULL THEN quantity ELSE 0 END AS in_flight
			FROM new_rows
			UNION ALL
			SELECT sku, -(state = 'waiting' OR state = 'pending' AND claimed_at IS NOT NULL)::int,
				CASE WHEN state = 'pending' AND claimed_at IS NULL THEN -quantity ELSE 0 END
			FROM old_rows) AS d
		GROUP BY sku HAVING sum(queued) <> 0 OR sum(in_flight) <> 0 ORDER BY sku
		ON CONFLICT (sku) DO UPDATE SET queued = c.queued + excluded.queued, in_flight = c.in_flight + excluded.in_flight;
	ELSE
		UPDATE admission_counts AS c SET queued = c.queued - d.queued, in_flight = c.in_flight - d.in_flight
		FROM (SELECT sku, sum((state = 'waiting' OR state = 'pending' AND claimed_at IS NOT NULL)::int) AS queued,
				sum(CASE WHEN state = 'pending' AND claimed_at IS NULL THEN quantity ELSE 0 END) AS in_flight
			FROM old_rows GROUP BY sku) AS d
		WHERE c.sku = d.sku AND (d.queued <> 0 OR d.in_flight <> 0);
	END IF;
	RETURN NULL;
END $$;
-- +goose StatementEnd

CREATE TRIGGER admission_counts_insert AFTER INSERT ON admission_tickets
	REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION admission_counts_apply();
CREATE TRIGGER admission_counts_update AFTER UPDATE ON admission_tickets
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION admission_counts_apply();
CREATE TRIGGER admission_counts_delete AFTER DELETE ON admission_tickets
	REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION admission_counts_apply();

-- A drawn SKU's open tickets in drawn order, for its worker's pass
-- (OpenTickets; in order of arrival it reads admission_tickets_open).
CREATE INDEX admission_tickets_drawn ON admission_tickets (sku, draw_rank) WHERE draw_rank IS NOT NULL AND state IN ('pending', 'waiting');

-- The counts of the tickets already there, read after the triggers exist
-- (CREATE TRIGGER locks the table against writes until this migration
-- commits): no change is counted twice or missed.
INSERT INTO admission_counts (sku, queued, in_flight)
SELECT sku, count(*) FILTER (WHERE state = 'waiting' OR state = 'pending' AND claimed_at IS NOT NULL),
	coalesce(sum(quantity) FILTER (WHERE state = 'pending' AND claimed_at IS NULL), 0)
FROM admission_tickets WHERE state IN ('pending', 'waiting') GROUP BY sku;

-- +goose Down
DROP INDEX admission_tickets_drawn;
DROP TRIGGER admission_counts_delete ON admission_tickets;
DROP TRIGGER admission_counts_update ON admission_tickets;
DROP TRIGGER admission_counts_insert ON admission_tickets;
DROP FUNCTION admission_counts_apply();
DROP TABLE admission_counts;
