-- +goose Up
-- Admission (docs/admission.md): a SKU under admission sells only through
-- purchase tokens. admission_mode '' is no admission.
ALTER TABLE skus ADD COLUMN admission_mode text NOT NULL DEFAULT '',
	ADD COLUMN token_ttl_ms bigint NOT NULL DEFAULT 0,
	ADD COLUMN waitlist_max bigint NOT NULL DEFAULT 0,
	ADD COLUMN tokens_per_customer bigint NOT NULL DEFAULT 0;

-- Every request for a token is a ticket, in order of arrival (seq): one
-- answered with a token at once is admitted at once (direct). A ticket is
-- admitted by a reserve whose key is derived from its id
-- (stock.TicketKey), so that the row and the shard agree however often the
-- admission is retried.
CREATE TABLE admission_tickets (
	ticket_id text PRIMARY KEY,
	seq bigserial NOT NULL UNIQUE,
	sku text NOT NULL,
	quantity bigint NOT NULL CHECK (quantity > 0),
	idempotency_key text NOT NULL,
	params_hash bytea NOT NULL,
	customer_ref text NOT NULL DEFAULT '',
	state text NOT NULL CHECK (state IN ('pending', 'waiting', 'admitted', 'sold_out', 'cancelled')),
	token_id text NOT NULL DEFAULT '',
	expires_at timestamptz,
	direct boolean NOT NULL DEFAULT false,
	-- Set when a worker takes a waiting ticket to admit it (state back to
	-- pending): its reserve may be in flight, and whoever holds the SKU's
	-- lease next finishes it, whatever the units free.
	claimed_at timestamptz,
	created_at timestamptz NOT NULL DEFAULT now(),
	updated_at timestamptz NOT NULL DEFAULT now(),
	UNIQUE (sku, idempotency_key)
);
-- The waitlist in order, and the position queries.
CREATE INDEX admission_tickets_open ON admission_tickets (sku, seq) WHERE state IN ('pending', 'waiting');
-- tokens_per_customer.
CREATE INDEX admission_tickets_customer ON admission_tickets (sku, customer_ref) WHERE customer_ref <> '';

-- +goose Down
DROP TABLE admission_tickets;
ALTER TABLE skus DROP COLUMN admission_mode, DROP COLUMN token_ttl_ms, DROP COLUMN waitlist_max, DROP COLUMN tokens_per_customer;
