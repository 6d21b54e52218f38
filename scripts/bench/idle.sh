#!/usr/bin/env bash
# idle.sh: `make bench-idle`. The stack's fixed CPU cost: the dev stack as
# `make bench` starts it (one allocator owning every partition,
# BENCH_STACK_ARGS) on a private durable Postgres with pg_stat_statements,
# left without traffic. After BENCH_IDLE_SETTLE (default 15s) it samples
# /proc/PID/stat (utime+stime) of the stack's processes (the dev process and
# its children) and of every process of the private cluster over
# BENCH_IDLE_DURATION (default 30s), and prints milliseconds of CPU a second
# for each, then the statements Postgres ran a second (pg_stat_statements,
# reset at the start of the sample). BENCH_IDLE_PPROF=FILE also writes a CPU
# profile of the allocator over the sample (SHARDSTOCK_PPROF=1).
# BENCH_IDLE_BIN=PATH runs that build of cmd/shardstock-dev instead of the
# working tree's (e.g. another revision's, to compare).
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly settle=${BENCH_IDLE_SETTLE:-15s}
readonly duration=${BENCH_IDLE_DURATION:-30s}
readonly stack_args=${BENCH_STACK_ARGS--shard-servers 0 -allocator-shard}
readonly pprof_out=${BENCH_IDLE_PPROF:-}
readonly stack_log=${BENCH_STACK_LOG:-tmp/bench-idle-stack.log}

# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
mkdir -p "$(dirname "$stack_log")"
bin=${BENCH_IDLE_BIN:-bin/shardstock-dev}
private_pg_setup # $tmp, the builds, and private_pg_cleanup at exit
pg_dir=$tmp/pg
stack_pid=""
cleanup() {
	local rc=$?
	if [[ -n $stack_pid ]]; then
		kill -TERM "$stack_pid" 2>/dev/null || true
		wait "$stack_pid" 2>/dev/null || true
	fi
	(exit "$rc")
	private_pg_cleanup
}
trap cleanup EXIT

server=$(POSTGRES_OPTS="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" \
	scripts/bench/postgres.sh start "$pg_dir")
psql "$server" -XAtq -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
psql "$server" -XAtq -c "CREATE DATABASE idle TEMPLATE template0"
url=${server/\/postgres\?/\/idle?}
psql "$url" -XAtq -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
pg_pid=$(head -1 "$pg_dir/data/postmaster.pid")

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addr=127.0.0.1:$(port)
ops=127.0.0.1:$(port)
pprof_on=""
[[ -n $pprof_out ]] && pprof_on=1
# shellcheck disable=SC2086 # the stack's flags are space-separated
SHARDSTOCK_ADDR=$addr SHARDSTOCK_OPERATOR_ADDR=$ops DATABASE_URL=$url ETCD_ENDPOINTS= \
	SHARDSTOCK_ADMIN_TOKEN=$(openssl rand -hex 16) SHARDSTOCK_SERVICE_TOKEN=$(openssl rand -hex 16) \
	SHARDSTOCK_PPROF=$pprof_on "$bin" $stack_args >"$stack_log" 2>&1 &
stack_pid=$!
for ((i = 0; i < 180; i++)); do
	curl -fsS -o /dev/null "http://$addr/readyz" 2>/dev/null && break
	kill -0 "$stack_pid" 2>/dev/null || { echo "bench-idle: the stack exited; see $stack_log" >&2; exit 1; }
	sleep 0.5
done
curl -fsS -o /dev/null "http://$addr/readyz" || { echo "bench-idle: the stack is not ready; see $stack_log" >&2; exit 1; }
sleep "$settle"

# descendants PID...: the PIDs and all their descendants.
descendants() {
	local p
	for p in "$@"; do
		echo "$p"
		descendants $(cat /proc/"$p"/task/*/children 2>/dev/null)
	done
}
# ticks PID...: utime+stime of the processes (dead ones count as 0).
ticks() {
	local p sum=0 f
	for p in "$@"; do
		f=$(cat /proc/"$p"/stat 2>/dev/null) || continue
		f=${f##*) }
		read -r -a a <<<"$f"
		sum=$((sum + a[11] + a[12]))
	done
	echo "$sum"
}
hz=$(getconf CLK_TCK)
secs=${duration%s}
stack_procs=$(descendants "$stack_pid")
pg_procs=$(descendants "$pg_pid")
psql "$url" -XAtq -c "SELECT pg_stat_statements_reset()" >/dev/null
if [[ -n $pprof_out ]]; then
	curl -fsS -o "$pprof_out" "http://$ops/debug/pprof/profile?seconds=$secs" &
	profiling=$!
fi
declare -A own0
for p in $stack_procs; do own0[$p]=$(ticks "$p"); done
# shellcheck disable=SC2086
s0=$(ticks $stack_procs) p0=$(ticks $pg_procs) t0=$(date +%s.%N)
sleep "$secs"
# New Postgres backends (connections opened in the sample) count too: their
# CPU is all within it, except for those that also ended in it.
pg_procs=$(descendants "$pg_pid")
# shellcheck disable=SC2086
s1=$(ticks $stack_procs) p1=$(ticks $pg_procs) t1=$(date +%s.%N)
if [[ -n ${profiling:-} ]]; then wait "$profiling"; fi
el=$(echo "$t1 - $t0" | bc -l)
printf 'bench-idle: %s, %ss without traffic after %s; load %s\n' "$bin" "$secs" "$settle" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'bench-idle: stack %.1f ms/s, Postgres %.1f ms/s, total %.1f ms/s\n' \
	"$(echo "($s1 - $s0) * 1000 / $hz / $el" | bc -l)" "$(echo "($p1 - $p0) * 1000 / $hz / $el" | bc -l)" \
	"$(echo "($s1 - $s0 + $p1 - $p0) * 1000 / $hz / $el" | bc -l)"
for p in $stack_procs; do
	printf 'bench-idle:   %.1f ms/s %s\n' "$(echo "($(ticks "$p") - ${own0[$p]}) * 1000 / $hz / $el" | bc -l)" \
		"$(tr '\0' ' ' </proc/"$p"/cmdline | cut -c1-80)"
done
psql "$url" -XAq -P pager=off -c "SELECT round((calls / $el)::numeric, 2) AS calls_per_s,
	round(((total_exec_time + total_plan_time) / $el)::numeric, 3) AS ms_per_s, plans,
	left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS query
	FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
	ORDER BY calls DESC LIMIT 25"
