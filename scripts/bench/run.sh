#!/usr/bin/env bash
# run.sh: `make bench`. Builds the dev stack and loadgen, picks a Postgres,
# and runs loadgen against a stack it starts itself: every target (the
# in-memory ceiling, shardstock and the five baselines) on the hot-SKU
# model C with 64 clients,
# shardstock again at 80% of the rate it reached (latency below the peak),
# then the source document's case. It prints a table per model with the
# ratios against baseline (2), stops the stack with SIGTERM, and exits
# non-zero if shardstock's correctness line is not all zero.
#
# Postgres, in order: $DATABASE_URL; 127.0.0.1:5432 if it answers with
# enough free connections for the stack and the baselines; else a private,
# durable cluster (scripts/bench/postgres.sh) in a temporary directory.
#
# The stack is one allocator with its own shard server owning every
# partition (BENCH_STACK_ARGS, default "-shard-servers 0 -allocator-shard":
# the fastest deployment on a 2-core machine; "" for make run's three shard
# servers).
#
# BENCH_DURATION (default 5s) is the load time of each target; the whole run
# is bounded by BENCH_TIMEOUT (default 170s). The stack's output is kept in
# BENCH_STACK_LOG (default tmp/bench-stack.log, ignored by git).
#
# BENCH_INTERLEAVE=N (2 or more) runs each model's targets in N rounds of
# turns (loadgen -interleave), without the paced rerun and the disk probe;
# loadgen refuses it with model case and with redis beside another Redis
# target, so set BENCH_MODELS and BENCH_TARGETS too (make bench-turns).
#
# BENCH_PG_CRASH="EVERY COUNT" (make soak-crash: "5s 8") crash-restarts
# Postgres COUNT times, EVERY apart, during each shardstock load (loadgen
# -pg-crash-every, -pg-crash-count, -pg-data). It always uses a private
# cluster of its own, whatever DATABASE_URL says: never a shared server.
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly duration=${BENCH_DURATION:-5s}
readonly timeout=${BENCH_TIMEOUT:-170s}
readonly stack_log=${BENCH_STACK_LOG:-tmp/bench-stack.log}
# make soak sets these: one target, other models, faults (see the Makefile).
readonly targets=${BENCH_TARGETS:-memory,shardstock,naive,onerow,subrows,redis,redis-fsync,redis-api}
readonly stack_args=${BENCH_STACK_ARGS--shard-servers 0 -allocator-shard}
readonly models=${BENCH_MODELS:-C,case}
readonly interleave=${BENCH_INTERLEAVE:-}
turns=false
if [[ -n $interleave && $interleave != 0 && $interleave != 1 ]]; then
	turns=true
	read -r -a extra <<<"${BENCH_EXTRA:-}"
	extra+=(-interleave "$interleave")
else
	read -r -a extra <<<"${BENCH_EXTRA:--paced 0.8}"
fi
read -r crash_every crash_count <<<"${BENCH_PG_CRASH:-}"
readonly local_url='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
# The dev stack's pools (3 shard servers x 32 + allocator 16), one baseline
# pool of 50 and a few to spare.
readonly conns_needed=$((3 * 32 + 16 + 50 + 10))

start_s=$SECONDS
tmp=$(mktemp -d)
chmod 755 "$tmp" # the postgres OS user must reach its data directory
pg_dir=""
cleanup() {
	local rc=$?
	if [[ -n $pg_dir ]]; then scripts/bench/postgres.sh stop "$pg_dir" || true; fi
	rm -rf "$tmp"
	echo "bench: wall time $((SECONDS - start_s))s, exit status $rc" >&2
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$(dirname "$stack_log")"
go build -o bin/shardstock-dev ./cmd/shardstock-dev
go -C bench build -o ../bin/loadgen ./cmd/loadgen

free_local_conns() {
	command -v psql >/dev/null 2>&1 || return 1
	psql "$local_url" -XAtq -c "SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int" 2>/dev/null
}

if [[ -n ${crash_count:-} ]]; then
	: # a crash soak crashes its own cluster only: the private one below
elif [[ -n ${DATABASE_URL:-} ]]; then
	url=$DATABASE_URL
	note="Postgres from DATABASE_URL"
elif free=$(free_local_conns) && ((free >= conns_needed)); then
	url=$local_url
	note="Postgres on 127.0.0.1:5432"
fi
if [[ -z ${url:-} ]]; then
	if [[ -n ${crash_count:-} ]]; then
		echo "bench: Postgres crash-restarts: starting a private durable Postgres to crash" >&2
	else
		echo "bench: 127.0.0.1:5432 ${free:+has $free free connections, }not enough for the stack and the baselines ($conns_needed): starting a private durable Postgres" >&2
	fi
	pg_dir=$tmp/pg
	url=$(scripts/bench/postgres.sh start "$pg_dir")
	note="a private durable Postgres (fsync on) on ${url#*@}"
	note=${note%%/*}
fi
# The disk probe times small durable writes beside the load (loadgen
# -disk-probe): in the private cluster's directory when there is one, else
# in the temporary directory, which is the database's disk only on a
# one-disk machine (as here) and not if it is a tmpfs.
probe_dir=${pg_dir:-$tmp}
if ! $turns; then
	extra+=(-disk-probe "$probe_dir")
fi
if [[ -n ${crash_count:-} ]]; then
	extra+=(-pg-crash-every "$crash_every" -pg-crash-count "$crash_count" -pg-data "$pg_dir/data")
fi
echo "bench: $note" >&2
echo "bench: load $duration per target; machine load: $(uptime)" >&2

# loadgen stops the stack itself (SIGTERM) on every path, a signal included;
# timeout bounds the whole run and gives loadgen time to stop it.
timeout --signal=TERM --kill-after=45s "$timeout" \
	bin/loadgen -stack bin/shardstock-dev -stack-args "$stack_args" -database-url "$url" -database-note "$note" -stack-log "$stack_log" \
	-target "$targets" -model "$models" \
	-concurrency 64 -duration "$duration" -progress=false "${extra[@]}"
