#!/usr/bin/env bash
# changestream.sh: `make bench-changestream`. What WatchLedger consumers
# cost the writers, in one run: one dev stack (one allocator owning every
# partition, on a throwaway Postgres of its own: the stack's children), the
# same deduct load (loadgen, model A) with 0, 1 and 4 consumers attached
# (`stockctl -json watch ledger`, every entry, each run under
# bench/cmd/watchlag), twice each: unpaced (the peak: deducts/s and the
# consumers' lag there) and paced at one rate for all (CS_RATE a second;
# default 40% of the warm-up's unpaced rate). Server CPU per deduct is the
# stack's processes and their children, Postgres's backends included
# (loadgen -server-pids), never the consumers'; the consumers' own CPU
# (watchlag and its stockctl) is reported apart, per entry received. On
# two cores the consumers take CPU from the writers and from loadgen, which
# lowers the rate, and a writer's CPU per deduct depends on the rate (the
# deducts a group transaction carries, printed for every load): the paced
# ratios, at a rate the machine serves with 4 consumers too, compare at
# one rate. Lag: for each entry a consumer printed during
# the load, the time it printed it less the entry's createdAt, p50 and p99
# over every consumer's entries. Consumers start from the ledger's head (a
# cursor taken just before) and have read what follows it before the load
# starts, so that their catching up is not measured. The machine may be
# shared: after a warm-up load (not counted), the runs go in CS_ROUNDS
# rounds (default 3) of 0, 1 and 4 consumers, interleaved (each round
# starts one later in that order), and each round gives its ratios against
# its own run with none. CS_DURATION (default 15s) is each load's length.
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly duration=${CS_DURATION:-15s}
readonly rounds=${CS_ROUNDS:-3}
readonly token=changestream-bench-token-0123456789
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

go build -o bin/shardstock-dev ./cmd/shardstock-dev
go build -o bin/stockctl ./cmd/stockctl
go -C bench build -o ../bin/loadgen ./cmd/loadgen
go -C bench build -o ../bin/watchlag ./cmd/watchlag

addr=127.0.0.1:$((20000 + RANDOM % 20000))
ops=127.0.0.1:$((40000 + RANDOM % 20000))
env -u DATABASE_URL bin/shardstock-dev -addr "$addr" -operator-addr "$ops" -admin-token "$token" \
	-shard-servers 0 -allocator-shard >"$tmp/stack.log" 2>&1 &
stack=$!
pids+=("$stack")
for _ in $(seq 600); do
	grep -q '"ready":true' "$tmp/stack.log" && break
	sleep 0.1
done
grep -q '"ready":true' "$tmp/stack.log" || { cat "$tmp/stack.log"; exit 1; }

# caughtUp waits until no entry was delivered for a second: the consumers
# have read the ledger written so far (at most a minute).
caughtUp() {
	local a b
	for _ in $(seq 60); do
		a=$(curl -s "http://$ops/metrics" | awk '/^shardstock_watch_entries_delivered_total\{stream="ledger"\}/ { print $2 }')
		sleep 1
		b=$(curl -s "http://$ops/metrics" | awk '/^shardstock_watch_entries_delivered_total\{stream="ledger"\}/ { print $2 }')
		if [[ $a == "$b" ]]; then return; fi
	done
	echo "changestream.sh: the consumers did not catch up within a minute" >&2
	exit 1
}

# head sets cursor to one at the ledger's head, read on from the cursor it
# had: a watch of a SKU no entry names reads the ledger without printing an
# entry and prints its cursor every second as it goes; at the head, nothing
# being written between the loads, the cursor stops changing (at most two
# minutes).
cursor=
head() {
	local w last='' now
	bin/stockctl -url "http://$addr" -admin-token "$token" -json watch ledger -sku bench-no-entry -cursor "$cursor" >"$tmp/head" 2>/dev/null &
	w=$!
	for _ in $(seq 40); do
		sleep 3
		now=$(tail -n 1 "$tmp/head" | sed -n 's/.*"cursor":"\([^"]*\)".*/\1/p')
		now=${now:-$cursor} # nothing printed: nothing written since the cursor
		if [[ -n $now && $now == "$last" ]]; then break; fi
		last=$now
	done
	kill "$w" 2>/dev/null || true
	wait "$w" 2>/dev/null || true
	[[ -n $last && $last == "$now" ]] || { echo "changestream.sh: the ledger's head not reached within 2 min" >&2; exit 1; }
	cursor=$last
}

# load runs loadgen's deduct load for $1, its output into $2, at $3
# deducts a second (0: unpaced).
load() {
	bin/loadgen -target shardstock -model A -skus 200 -duration "$1" -rate "${3:-0}" -addr "http://$addr" -admin-token "$token" \
		-server-pids "$stack" -progress=false >"$2" 2>&1 || true
}

# groups prints the requests the shard writers have batched and the group
# transactions they have committed (their metrics), so that two calls
# around a load give the requests one Postgres transaction carried.
groups() {
	curl -s "http://$ops/metrics" | awk '/^shardstock_shard_batch_size_sum/ { s += $2 } /^shardstock_shard_group_batches_count/ { c += $2 }
		END { printf "%d %d\n", s, c }'
}

# perGroup prints the requests per group transaction between two groups lines.
perGroup() {
	awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.1f", (y[2] > x[2] ? (y[1] - x[1]) / (y[2] - x[2]) : 0) }'
}

# ticks prints the CPU time, in clock ticks, of the processes $@ and of
# their children (a watchlag and its stockctl), the exited ones included.
ticks() {
	local p k t=0
	for p in "$@"; do
		for k in "$p" $(pgrep -P "$p" || true); do
			t=$((t + $(awk '{ i = index($0, ") "); split(substr($0, i + 2), a, " "); print a[12] + a[13] + a[14] + a[15] }' "/proc/$k/stat" 2>/dev/null || echo 0)))
		done
	done
	echo "$t"
}

# lagOf prints the p99 lag, s, of the consumers' entries printed within
# the load of loadgen output $1 begun at $2, and sets lagLine to a summary.
lagOf() {
	local from to
	# The load's own window: loadgen says how long its setup and load took.
	# Go prints a duration in ms below a second ("setup 981ms").
	read -r from to < <(sed -n 's/.*setup \([0-9.]*m*s\), load \([0-9.]*m*s\).*/\1 \2/p' "$1" |
		awk -v t0="$2" 'function sec(d) { return d ~ /ms$/ ? d / 1000 : d + 0 } { printf "%.6f %.6f\n", t0 + sec($1), t0 + sec($1) + sec($2) }')
	cat "$tmp"/lag-* | awk -v from="${from:-0}" -v to="${to:-9e9}" '$1 >= from && $1 <= to { print $2 }' | sort -g >"$tmp/lags"
	awk '{ v[NR] = $1 } END { printf "lag (s): p50 %.3f p99 %.3f max %.3f over %d entries received\n", v[int(NR*0.5)+1], v[int(NR*0.99)+1], v[NR], NR }' "$tmp/lags" >&2
	awk '{ v[NR] = $1 } END { printf "%.3f", v[int(NR*0.99)+1] }' "$tmp/lags"
}

# measure runs the loads with $1 consumers attached, unpaced then paced,
# and sets, unpaced: cpu[$1] (server CPU per deduct, µs), rate[$1]
# (deducts/s), p99[$1] (lag, s), ccpu[$1] (the consumers' CPU per entry
# they received, µs), batch[$1] (deducts per group transaction); paced:
# pcpu[$1], pp99[$1], pbatch[$1] and prated[$1] (the rate reached: below
# $prate, the paced run was the peak).
declare -A cpu rate p99 ccpu pcpu pp99 prated batch pbatch
measure() {
	local n=$1 watchers=() i t0 c0 c1 g0 lines
	rm -f "$tmp"/lag-*
	if ((n > 0)); then head; fi
	for i in $(seq "$n"); do
		bin/watchlag bin/stockctl -url "http://$addr" -admin-token "$token" -json watch ledger -cursor "$cursor" -consumer "bench-$i" >"$tmp/lag-$i" &
		watchers+=("$!")
		pids+=("$!")
	done
	if ((n > 0)); then caughtUp; fi
	echo "== $n consumers, unpaced"
	c0=$(ticks "${watchers[@]}")
	lines=0
	if ((n > 0)); then lines=$(cat "$tmp"/lag-* | wc -l); fi
	g0=$(groups)
	t0=$(date +%s.%N)
	load "$duration" "$tmp/load-$n"
	c1=$(ticks "${watchers[@]}")
	batch[$n]=$(perGroup "$g0" "$(groups)")
	echo "deducts per group transaction: ${batch[$n]}"
	grep -E 'shardstock|server|CPU|oversold' "$tmp/load-$n" || true
	cpu[$n]=$(sed -n 's/^  shardstock: server \([0-9]*\)µs.*/\1/p' "$tmp/load-$n")
	rate[$n]=$(awk '$1 == "shardstock" && $7 ~ /^[0-9.]+$/ { print $7; exit }' "$tmp/load-$n")
	p99[$n]=- ccpu[$n]=- pp99[$n]=-
	if ((n > 0)); then
		p99[$n]=$(lagOf "$tmp/load-$n" "$t0")
		lines=$(($(cat "$tmp"/lag-* | wc -l) - lines))
		ccpu[$n]=$(awk -v t=$((c1 - c0)) -v l="$lines" 'BEGIN { printf "%.0f", (l > 0 ? t * 10000 / l : 0) }')
		echo "consumers' CPU: ${ccpu[$n]}µs per entry received ($lines entries)"
		caughtUp
	fi
	echo "== $n consumers, paced at $prate deducts/s"
	g0=$(groups)
	t0=$(date +%s.%N)
	load "$duration" "$tmp/paced-$n" "$prate"
	pbatch[$n]=$(perGroup "$g0" "$(groups)")
	echo "deducts per group transaction: ${pbatch[$n]}"
	grep -E 'shardstock|server|CPU|oversold' "$tmp/paced-$n" || true
	pcpu[$n]=$(sed -n 's/^  shardstock: server \([0-9]*\)µs.*/\1/p' "$tmp/paced-$n")
	prated[$n]=$(awk '$1 == "shardstock" && $7 ~ /^[0-9.]+$/ { print $7; exit }' "$tmp/paced-$n")
	if ((n > 0)); then pp99[$n]=$(lagOf "$tmp/paced-$n" "$t0"); fi
	for i in "${watchers[@]}"; do kill "$i" 2>/dev/null || true; done
	for i in "${watchers[@]}"; do wait "$i" 2>/dev/null || true; done
}

echo "== warm-up (not counted)"
load 5s "$tmp/warm-up"
load 10s "$tmp/warm-up"
warm=$(awk '$1 == "shardstock" && $7 ~ /^[0-9.]+$/ { print $7; exit }' "$tmp/warm-up")
prate=${CS_RATE:-$(awk -v w="${warm:-0}" 'BEGIN { printf "%d", w * 0.4 }')}
echo "paced runs at $prate deducts/s (CS_RATE; default 40% of the warm-up's unpaced $warm/s)"
((prate > 0)) || { cat "$tmp/warm-up"; echo "changestream.sh: no rate from the warm-up" >&2; exit 1; }
order=(0 1 4)
summary=()
for r in $(seq "$rounds"); do
	echo "=== round $r"
	for k in 0 1 2; do
		measure "${order[(r - 1 + k) % 3]}"
	done
	line=$(awk -v c0="${cpu[0]}" -v c1="${cpu[1]}" -v c4="${cpu[4]}" -v r0="${rate[0]}" -v r1="${rate[1]}" -v r4="${rate[4]}" \
		-v l1="${p99[1]}" -v l4="${p99[4]}" -v k1="${ccpu[1]}" -v k4="${ccpu[4]}" -v r="$r" \
		-v p0="${pcpu[0]}" -v p1="${pcpu[1]}" -v p4="${pcpu[4]}" -v q1="${pp99[1]}" -v q4="${pp99[4]}" -v pr="$prate" \
		-v s0="${prated[0]}" -v s1="${prated[1]}" -v s4="${prated[4]}" \
		-v b0="${batch[0]}" -v b1="${batch[1]}" -v b4="${batch[4]}" -v d0="${pbatch[0]}" -v d1="${pbatch[1]}" -v d4="${pbatch[4]}" -v la="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
		printf "round %d (load %s): unpaced: server CPU per deduct 0/1/4 consumers %s/%s/%s µs (1 vs 0: %.2fx, 4 vs 0: %.2fx) at %s/%s/%s deducts/s, %s/%s/%s a group transaction; lag p99 %s s (1), %s s (4); consumers %s/%s µs CPU per entry. paced at %s/s (reached %s/%s/%s; %s/%s/%s a group): %s/%s/%s µs (1 vs 0: %.2fx, 4 vs 0: %.2fx); lag p99 %s s (1), %s s (4)",
			r, la, c0, c1, c4, c1 / c0, c4 / c0, r0, r1, r4, b0, b1, b4, l1, l4, k1, k4, pr, s0, s1, s4, d0, d1, d4, p0, p1, p4, p1 / p0, p4 / p0, q1, q4 }')
	echo "$line"
	summary+=("$line")
done
echo "=== $rounds rounds, $duration each (load average $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%s\n' "${summary[@]}"
