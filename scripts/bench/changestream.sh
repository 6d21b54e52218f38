#!/usr/bin/env bash
# changestream.sh: `make bench-changestream`. What WatchLedger consumers
# cost the writers, in one run: one dev stack (one allocator owning every
# partition, on a throwaway Postgres of its own: the stack's children), the
# same unpaced deduct load (loadgen, model A) with 0, 1 and 4 consumers
# attached (`stockctl -json watch ledger`, every entry, output discarded),
# the server's CPU per deduct (loadgen -server-pids: the stack's processes
# and their children, Postgres's backends included), and, with consumers,
# their lag: shardstock_watch_lag_seconds sampled every 100 ms from the
# allocator's /metrics during the load, the largest over consumers, p50 and
# p99 over the samples. Consumers start from the ledger's beginning and
# have read it before the load starts. CS_DURATION (default 15s) is each
# load's length.
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly duration=${CS_DURATION:-15s}
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

# lag samples the consumers' lag until its file's stop mark appears: a
# sample only while entries flow (the delivered count rose since the last),
# so that loadgen's setup and check, which write no entries, count not.
lag() {
	local last=0 now m
	while [[ ! -e $1.stop ]]; do
		read -r now m < <(curl -s "http://$ops/metrics" | awk '
			/^shardstock_watch_entries_delivered_total\{stream="ledger"\}/ { d = $2 }
			/^shardstock_watch_lag_seconds\{/ { if ($2 > m) m = $2 }
			END { print d + 0, m + 0 }')
		if [[ $now != "$last" ]]; then echo "$m" >>"$1"; fi
		last=$now
		sleep 0.1
	done
}

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
}

for n in 0 1 4; do
	watchers=()
	for i in $(seq "$n"); do
		bin/stockctl -url "http://$addr" -admin-token "$token" -json watch ledger -consumer "bench-$i" >/dev/null 2>&1 &
		watchers+=("$!")
		pids+=("$!")
	done
	if ((n > 0)); then caughtUp; fi
	: >"$tmp/lag-$n"
	lag "$tmp/lag-$n" &
	sampler=$!
	echo "== $n consumers"
	bin/loadgen -target shardstock -model A -skus 200 -duration "$duration" -addr "http://$addr" -admin-token "$token" \
		-server-pids "$stack" -progress=false 2>&1 | grep -E 'shardstock|server|CPU|oversold' || true
	touch "$tmp/lag-$n.stop"
	wait "$sampler"
	for w in "${watchers[@]}"; do kill "$w" 2>/dev/null || true; done
	if ((n > 0)); then
		sort -g "$tmp/lag-$n" | awk '{ v[NR] = $1 } END { printf "lag (s): p50 %.3f p99 %.3f max %.3f over %d samples\n", v[int(NR*0.5)+1], v[int(NR*0.99)+1], v[NR], NR }'
	fi
done
