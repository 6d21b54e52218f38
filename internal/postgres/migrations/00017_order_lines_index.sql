-- +goose Up
-- GetOperation of an order line names its order: the line's key is a hash
-- of order and SKU, so the order is found by the line's reservation id in
-- its lines (jsonb containment, OrderOfLine).
CREATE INDEX orders_lines ON orders USING gin (lines jsonb_path_ops);

-- +goose Down
DROP INDEX orders_lines;
