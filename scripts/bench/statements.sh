#!/usr/bin/env bash
# statements.sh: `make bench-statements`. Where Postgres's share of a
# deduct goes, statement by statement: starts a private durable Postgres
# (scripts/bench/postgres.sh) with pg_stat_statements loaded, runs loadgen
# against the dev stack on it (one allocator with its own shard server; one
# hot SKU of 16 shards, 64 clients, deducts; BENCH_MODEL_ARGS and
# BENCH_DURATION change that; BENCH_STACK_ARGS the dev stack's flags, e.g.
# "" for `make run`'s three shard servers), then prints each statement the load ran with
# its calls, rows, execution time per call and per answered request. Time
# outside statements (parse, bind, protocol, commit, WAL) is not in
# pg_stat_statements: loadgen's "Postgres" share of the server CPU is the
# whole.
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly duration=${BENCH_DURATION:-8s}
readonly stack_args=${BENCH_STACK_ARGS--shard-servers 0 -allocator-shard}
read -r -a model_args <<<"${BENCH_MODEL_ARGS:--model A -skus 1 -stock 1000000000 -shards 16}"
readonly top=${BENCH_STATEMENTS_TOP:-14}
readonly calls_min=100

# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh
private_pg_setup
url=$(POSTGRES_OPTS="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" \
	scripts/bench/postgres.sh start "$tmp/pg")
psql "$url" -XAtq -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"

# Reset once the stack has set its database up (migrations, fences):
# loadgen prints "shardstock: model" before it creates the run's SKUs. The
# SKUs' setup and the verification after the load call their statements a
# few times each; the load's are called thousands of times, so only
# statements called at least $calls_min times are listed and summed.
bin/loadgen -stack bin/shardstock-dev -stack-args "$stack_args" -database-url "$url" \
	-database-note "a private durable Postgres with pg_stat_statements" -target shardstock "${model_args[@]}" \
	-concurrency 64 -duration "$duration" -progress=false 2>&1 | tee "$tmp/loadgen.out" | while IFS= read -r line; do
	[[ $line == *"shardstock: model"* ]] && psql "$url" -XAtq -c "SELECT pg_stat_statements_reset()" >/dev/null
	echo "$line"
done
requests=$(awk '$1 == "shardstock" && $2 ~ /^[0-9]+$/ { print $2 }' "$tmp/loadgen.out")
[[ -n $requests && $requests -gt 0 ]] || { echo "statements.sh: no shardstock row in loadgen's output" >&2; exit 1; }

echo
echo "Postgres statements called at least $calls_min times during the run ($requests requests answered):"
psql "$url" -XAq -F $'\t' -P footer=off <<SQL | column -t -s $'\t'
SELECT calls, rows, round((total_exec_time / calls * 1000)::numeric) AS "µs/call",
	round((total_exec_time * 1000 / $requests)::numeric, 1) AS "µs/request",
	round(wal_bytes / $requests) AS "WAL B/request",
	left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement
FROM pg_stat_statements
WHERE calls >= $calls_min AND query NOT LIKE '%pg_stat_statements%'
ORDER BY total_exec_time DESC LIMIT $top;
SQL
psql "$url" -XAtq -c "SELECT 'all statements: ' || round((sum(total_exec_time) * 1000 / $requests)::numeric, 1) || ' µs of execution and '
	|| round(sum(wal_bytes) / $requests) || ' bytes of WAL per request'
	FROM pg_stat_statements WHERE calls >= $calls_min AND query NOT LIKE '%pg_stat_statements%'"
