#!/usr/bin/env bash
# audit.sh [ROUNDS]: `make bench-audit`. What the audit line costs a deduct:
# the same paced hot-SKU deducts on the dev stack (one allocator with its own
# shard server, DATABASE_URL's Postgres) with SHARDSTOCK_AUDIT_LOG=off, async
# and sync, one after another in each round, the modes' order turned round by
# round so that none always runs first. The machine is shared and its speed
# moves between runs minutes apart, so each round's async/off and sync/off
# ratios of server CPU per deduct (the stack's processes and Postgres's, from
# /proc; and their Go part alone, where the line is written) are printed, then
# their medians. BENCH_DURATION (default 10s) per run, BENCH_AUDIT_RATE
# (default 1500) deducts a second over 64 clients: below the peak, so every
# mode does the same work.
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly rounds=${1:-3}
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "audit.sh: ROUNDS $rounds: want 1 to 99" >&2; exit 2; }
readonly duration=${BENCH_DURATION:-10s}
readonly rate=${BENCH_AUDIT_RATE:-1500}
[[ $rate =~ ^[1-9][0-9]*$ ]] || { echo "audit.sh: BENCH_AUDIT_RATE $rate: want a whole number of deducts a second" >&2; exit 2; }
readonly url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

go build -o bin/shardstock-dev ./cmd/shardstock-dev
go -C bench build -o ../bin/loadgen ./cmd/loadgen

modes=(off async sync)
echo "audit.sh: $rounds rounds of off, async, sync (order turned each round); $duration each at $rate deducts/s, 64 clients, one hot SKU in 16 shards" >&2
for ((round = 1; round <= rounds; round++)); do
	for ((i = 0; i < 3; i++)); do
		mode=${modes[(i + round - 1) % 3]}
		echo "audit.sh: round $round, $mode ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
		SHARDSTOCK_AUDIT_LOG=$mode bin/loadgen -stack bin/shardstock-dev -stack-args "-shard-servers 0 -allocator-shard" -database-url "$url" \
			-target shardstock -concurrency 64 -duration "$duration" -rate "$rate" -progress=false \
			-model A -skus 1 -stock 1000000000 -shards 16 >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
		# One line per run: round mode server-µs Go-µs Postgres-µs req/s
		awk -v m="$mode" -v r="$round" '
			$1 == "shardstock" && $2 ~ /^[0-9]+$/ { rps = $7 }
			$1 == "shardstock:" && $2 == "server" {
				v = $3; sub("µs,?", "", v); cpu = v
				for (i = 4; i < NF; i++) if ($i == "Go" || $i == "Postgres") { v = $(i+1); sub("µs,?", "", v); part[$i] = v }
			}
			/oversold [1-9]|undersold [1-9]|duplicates [1-9]|lost acknowledged [1-9]|reconciliation differences [1-9]/ { bad = 1 }
			END {
				if (bad) { print "audit.sh: a correctness number was not 0" > "/dev/stderr"; exit 1 }
				if (cpu == "") { print "audit.sh: no server CPU in loadgen'"'"'s output" > "/dev/stderr"; exit 1 }
				print r, m, cpu, part["Go"], part["Postgres"], rps
			}' "$tmp/out" >>"$tmp/runs"
	done
done

echo "server CPU per deduct, each mode against off in the same round (whole server; Go part):"
awk '
	function median(a, n,   i, j, t) {
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
		return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
	}
	{ cpu[$1, $2] = $3; gopart[$1, $2] = $4; if ($1 > last) last = $1 }
	END {
		split("async sync", ms, " ")
		for (k = 1; k <= 2; k++) {
			m = ms[k]; n = 0; line = ""
			for (r = 1; r <= last; r++) if (cpu[r, "off"] > 0 && cpu[r, m] > 0) {
				n++; x[n] = cpu[r, m] / cpu[r, "off"]; g[n] = gopart[r, "off"] > 0 ? gopart[r, m] / gopart[r, "off"] : 0
				line = line sprintf(" %.2f/%.2f", x[n], g[n])
			}
			if (n) printf "%-5s / off: median %.2f, Go part %.2f (rounds, whole/Go:%s)\n", m, median(x, n), median(g, n), line
		}
	}' "$tmp/runs"
echo
echo "every run (round mode server-µs Go-µs Postgres-µs req/s):"
cat "$tmp/runs"
