#!/usr/bin/env bash
# rebalance.sh: `make bench-rebalance`. The rebalancer off and on, in the same
# run, on the same stack layout: model skew (every key's first choice is one
# of 2 of the SKU's 16 shards) and model C (one 100-unit hot SKU), each on a
# fresh dev stack (one allocator with its own shard server owning every
# partition, -allocator-shard). For each it prints loadgen's table
# (throughput, p99, correctness) and what routing needed, read from the
# allocator's /metrics before and after the load: checks, consolidations,
# reroutes (calls to another shard than the key's first choice), and the
# rebalancer's transfers and units moved; and the units still in transit at
# the end (loadgen's final GetStock, in its table).
#
# BENCH_MODELS (default "skew C") picks the models.
# Postgres: $DATABASE_URL, else 127.0.0.1:5432. BENCH_DURATION (default 10s)
# is the load time of each run; every run is bounded by BENCH_TIMEOUT
# (default 120s).
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly duration=${BENCH_DURATION:-10s}
readonly timeout=${BENCH_TIMEOUT:-120s}
readonly url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
readonly port=${BENCH_PORT:-18080}
readonly base=http://127.0.0.1:$port
# The allocator's operator listener (its /metrics), on the next port.
readonly ops=http://127.0.0.1:$((port + 1))
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
readonly token

go build -o bin/shardstock-dev ./cmd/shardstock-dev
go -C bench build -o ../bin/loadgen ./cmd/loadgen
mkdir -p tmp

stack_pid=""
stop_stack() {
	if [[ -n $stack_pid ]]; then
		kill -TERM "$stack_pid" 2>/dev/null || true
		wait "$stack_pid" 2>/dev/null || true
		stack_pid=""
	fi
}
trap stop_stack EXIT
trap 'exit 130' INT TERM

# counters prints the sum of each counter the comparison reads.
counters() {
	curl -fsS "$ops/metrics" | awk '
		/^shardstock_allocator_soldout_checks_total /                  { checks += $2 }
		/^shardstock_allocator_consolidations_total /          { cons += $2 }
		/^shardstock_allocator_reroutes_total /                { rer += $2 }
		/^shardstock_rebalancer_transfers_started_total/       { tr += $2 }
		/^shardstock_rebalancer_units_moved_total /            { moved += $2 }
		END { printf "%d %d %d %d %d\n", checks, cons, rer, tr, moved }'
}

run() { # run MODEL REBALANCE(0|1) LOADGEN-ARGS...
	local model=$1 on=$2
	shift 2
	SHARDSTOCK_REBALANCE=$on SHARDSTOCK_AUTO_SHARDS=0 SHARDSTOCK_ADMIN_TOKEN=$token DATABASE_URL=$url \
		bin/shardstock-dev -addr "127.0.0.1:$port" -operator-addr "127.0.0.1:$((port + 1))" -shard-servers 0 -allocator-shard >"tmp/bench-rebalance-stack.log" 2>&1 &
	stack_pid=$!
	for _ in $(seq 1 300); do
		curl -fsS "$base/readyz" >/dev/null 2>&1 && break
		sleep 0.1
	done
	read -r s0 c0 r0 t0 m0 < <(counters)
	timeout --signal=TERM --kill-after=15s "$timeout" \
		bin/loadgen -target shardstock -addr "$base" -admin-token "$token" -model "$model" \
		-concurrency 64 -duration "$duration" -progress=false "$@"
	read -r s1 c1 r1 t1 m1 < <(counters)
	stop_stack
	local open="?"
	if command -v psql >/dev/null 2>&1; then
		open=$(psql "$url" -XAtq -c "SELECT coalesce(sum(quantity), 0) FROM transfers WHERE state IN ('pending', 'debited')" 2>/dev/null || echo "?")
	fi
	local label=off
	((on == 1)) && label=on
	printf 'rebalance: model %s, rebalancer %s: %d checks, %d consolidations, %d reroutes, %d transfers started, %d units moved, %s units in open transfers after the stack stopped\n' \
		"$model" "$label" $((s1 - s0)) $((c1 - c0)) $((r1 - r0)) $((t1 - t0)) $((m1 - m0)) "$open"
}

for model in ${BENCH_MODELS:-skew C}; do
	for on in 0 1; do
		case $model in
		skew) run skew "$on" -skus 1 -shards 16 -stock 200000 -qty 1..3 ;;
		*) run "$model" "$on" -shards 16 -qty 1..3 ;;
		esac
	done
done
