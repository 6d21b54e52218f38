#!/usr/bin/env bash
# cart.sh: `make bench-cart`. What an order line costs against a deduct, in
# one run on one stack: loadgen starts the dev stack (one allocator owning
# every partition) on a private durable Postgres (scripts/bench/postgres.sh,
# fsync on) and runs on it, one after the other, model B with single-SKU
# deducts of one unit (the hottest 20% of the SKUs get 80%) and the cart
# model (orders of 2 to 5 lines, 4 hot SKUs get half the lines,
# ReserveOrder then CommitOrder, 10% of the paid orders refunded line by
# line), each with 64 clients for CART_DURATION (default 10s). Each model's
# table ends with its correctness line; the cart's says no order half held,
# no refund beyond its sale, books balanced. The last line states the server
# CPU per order line bought against the server CPU per deduct, and order
# lines per second against deducts per second (loadgen measures the
# server's CPU from /proc: the stack's processes and its Postgres's
# backends). The whole run is bounded by CART_TIMEOUT (default 170s); the
# stack's log is kept in tmp/bench-cart-stack.log.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
readonly duration=${CART_DURATION:-10s}
readonly timeout=${CART_TIMEOUT:-170s}
readonly stack_args=${BENCH_STACK_ARGS--shard-servers 0 -allocator-shard}

private_pg_setup
mkdir -p tmp
url=$(scripts/bench/postgres.sh start "$tmp/pg")
echo "bench-cart: load $duration per model; machine load: $(uptime)" >&2

# loadgen stops the stack itself (SIGTERM) on every path; timeout bounds
# the whole run and gives it time to.
timeout --signal=TERM --kill-after=45s "$timeout" \
	bin/loadgen -stack bin/shardstock-dev -stack-args "$stack_args" -database-url "$url" \
	-database-note "a private durable Postgres (fsync on)" -stack-log tmp/bench-cart-stack.log \
	-target shardstock -model B,cart -skus 200 -concurrency 64 -duration "$duration" -progress=false
