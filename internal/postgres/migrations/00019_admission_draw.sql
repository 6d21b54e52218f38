-- +goose Up
-- The draw (docs/admission.md): registration closes at draw_at.
ALTER TABLE skus ADD COLUMN draw_at timestamptz;

-- A ticket registered in a draw holds nothing until the draw ranks it;
-- a drawn ticket never admitted is lost once the SKU is sold out for good.
ALTER TABLE admission_tickets DROP CONSTRAINT admission_tickets_state_check,
	ADD CONSTRAINT admission_tickets_state_check
		CHECK (state IN ('pending', 'waiting', 'admitted', 'sold_out', 'cancelled', 'registered', 'lost')),
	ADD COLUMN draw_rank bigint;
-- One registration per customer and SKU, whatever the key.
CREATE UNIQUE INDEX admission_tickets_registered ON admission_tickets (sku, customer_ref) WHERE draw_rank IS NOT NULL OR state = 'registered';
-- The registrations in id order (the draw's input).
CREATE INDEX admission_tickets_registering ON admission_tickets (sku, ticket_id) WHERE state = 'registered';

-- A SKU's draw. The seed is recorded before any ticket is ranked or
-- admitted: a worker that takes over after a crash draws with it, never
-- with a new one. drawn_at is set with the ranks, in one transaction.
CREATE TABLE admission_draws (
	sku text PRIMARY KEY,
	seed bytea NOT NULL CHECK (length(seed) = 32),
	seeded_at timestamptz NOT NULL DEFAULT now(),
	drawn_at timestamptz,
	tickets bigint NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE admission_draws;
DROP INDEX admission_tickets_registering;
DROP INDEX admission_tickets_registered;
ALTER TABLE admission_tickets DROP COLUMN draw_rank, DROP CONSTRAINT admission_tickets_state_check,
	ADD CONSTRAINT admission_tickets_state_check CHECK (state IN ('pending', 'waiting', 'admitted', 'sold_out', 'cancelled'));
ALTER TABLE skus DROP COLUMN draw_at;
