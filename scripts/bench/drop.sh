#!/usr/bin/env bash
# drop.sh: `make bench-drop`. Model drop (issue 31), ROUNDS rounds (default
# 3) on one build: each round is one loadgen run on a stack of its own
# (one allocator owning every partition) on a private durable Postgres
# (scripts/bench/postgres.sh, fsync on). A round sends DROP_REQUESTS
# (default 3,000) arrivals at DROP_RATE a second (default 1,000, several
# times the peak of RequestToken on one SKU on this machine, and above a
# plain Reserve's under its load), open-loop with at most DROP_IN_FLIGHT
# (256) in flight, first as plain Reserves of a SKU of 1,000 units without
# admission, then as RequestTokens of a SKU of 1,000 units under
# ADMISSION_MODE_TOKENS (waitlist DROP_WAITLIST, 500; tokens and
# reservations bought 200 ms later, 5% released); the waitlist is settled;
# then DROP_AFTER (10,000) RequestTokens of the sold-out SKU, and as many
# Deducts of a sold-out SKU on the in-memory ceiling, at the same rate, in
# DROP_AFTER_ROUNDS (10) slices each taking turns (-drop-after-rounds). Even rounds run the phases of each pair the other way round
# (-drop-swap): the drop before the reserve phase, the ceiling before
# shardstock's refusals. Before the measured phases, DROP_WARMUP (default
# 500) Reserves and as many RequestTokens go, unmeasured, to SKUs of their
# own (-drop-warmup): neither measured phase pays for the fresh stack's
# first connections. Each round prints the time from the doors
# opening to the last unit in a token, the server CPU per granted token
# against per plain reservation, and per refused request after the
# sell-out against the ceiling's. The whole run is bounded by DROP_TIMEOUT
# (default 300s) a round; the stack's log is tmp/bench-drop-stack-N.log.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
readonly rounds=${1:-3}
readonly requests=${DROP_REQUESTS:-3000}
readonly rate=${DROP_RATE:-1000}
readonly waitlist=${DROP_WAITLIST:-500}
readonly after=${DROP_AFTER:-10000}
readonly after_rounds=${DROP_AFTER_ROUNDS:-10}
readonly in_flight=${DROP_IN_FLIGHT:-256}
readonly warmup=${DROP_WARMUP:-500}
readonly timeout=${DROP_TIMEOUT:-300s}
readonly stack_args=${BENCH_STACK_ARGS--shard-servers 0 -allocator-shard}

private_pg_setup
mkdir -p tmp
url=$(scripts/bench/postgres.sh start "$tmp/pg")
for ((i = 1; i <= rounds; i++)); do
	swap=false
	if ((i % 2 == 0)); then swap=true; fi
	echo "bench-drop: round $i of $rounds (swapped: $swap), $(date -u +%H:%M:%S) UTC; machine load: $(uptime)" >&2
	# loadgen stops the stack itself (SIGTERM) on every path; timeout
	# bounds the round and gives it time to.
	timeout --signal=TERM --kill-after=45s "$timeout" \
		bin/loadgen -stack bin/shardstock-dev -stack-args "$stack_args" -database-url "$url" \
		-database-note "a private durable Postgres (fsync on)" -stack-log "tmp/bench-drop-stack-$i.log" \
		-target shardstock -model drop -requests "$requests" -rate "$rate" -duration 30s -drop-swap="$swap" \
		-drop-waitlist "$waitlist" -drop-after "$after" -drop-after-rounds "$after_rounds" -drop-in-flight "$in_flight" -drop-warmup "$warmup" -progress=false
done
