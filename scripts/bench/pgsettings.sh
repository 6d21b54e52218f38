#!/usr/bin/env bash
# pgsettings.sh: `make bench-pgsettings`. What Postgres's own settings are
# worth to a durable deduct: one private durable Postgres
# (scripts/bench/postgres.sh), restarted with each set of settings in turn,
# the sets alternated round by round, and loadgen against the dev stack on
# it (one allocator with its own shard server) for each workload. Prints,
# per run, the server side's CPU per request (Go + Postgres) and the
# latency, then per set the median over the rounds of its CPU per request
# against the first set's in the same round (the first set is the
# baseline: "default" unless BENCH_PG_SETS says otherwise).
#
# Only settings a production operator would accept: fsync, synchronous_commit
# and full_page_writes stay on in every set.
#
# BENCH_PG_SETS: sets separated by ";", each NAME=postgres options, e.g.
# "default=;sb1g=-c shared_buffers=1GB". BENCH_PG_WORKLOADS: "hot C" by
# default (hot = one SKU of 1,000,000,000 units in 16 shards, deducts; C =
# model C). BENCH_PG_RATE paces every run (loadgen -rate; default 3000: a
# paced run does the same work whatever the build or setting, so CPU per
# request compares within a few percent; 0 = unpaced). BENCH_DURATION
# (default 6s) per run; ROUNDS (first argument, default 3).
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly rounds=${1:-3}
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "pgsettings.sh: ROUNDS $rounds: want 1 to 99" >&2; exit 2; }
readonly duration=${BENCH_DURATION:-6s}
readonly workloads=${BENCH_PG_WORKLOADS:-hot C}
readonly rate=${BENCH_PG_RATE:-3000}
[[ $rate =~ ^[0-9]+$ ]] || { echo "pgsettings.sh: BENCH_PG_RATE $rate: want a whole number of requests a second" >&2; exit 2; }
readonly default_sets="default=;\
sb2g=-c shared_buffers=2GB;\
opendsync=-c wal_sync_method=open_datasync;\
walzstd=-c wal_compression=zstd;\
walbuf=-c wal_buffers=64MB"
IFS=';' read -r -a sets <<<"${BENCH_PG_SETS:-$default_sets}"
for s in "${sets[@]}"; do
	[[ $s == *=* && -n ${s%%=*} ]] || { echo "pgsettings.sh: set '$s': want NAME=options" >&2; exit 2; }
	case " ${s#*=} " in
	*fsync=off* | *synchronous_commit=off* | *synchronous_commit=local* | *full_page_writes=off*)
		echo "pgsettings.sh: set '$s' gives up durability; not a setting to measure here" >&2
		exit 2
		;;
	esac
done

args_of() {
	case $1 in
	hot) echo "-model A -skus 1 -stock 1000000000 -shards 16" ;;
	C) echo "-model C" ;;
	*) echo "pgsettings.sh: unknown workload $1" >&2; exit 2 ;;
	esac
}
for w in $workloads; do args_of "$w" >/dev/null; done

# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh
private_pg_setup

rate_args=()
[[ $rate -gt 0 ]] && rate_args=(-rate "$rate")

# One line per run: round workload set cpu go pg req/s p50 p99.
results=$tmp/results
: >"$results"
for ((r = 1; r <= rounds; r++)); do
	for s in "${sets[@]}"; do
		name=${s%%=*} opts=${s#*=}
		scripts/bench/postgres.sh stop "$tmp/pg"
		url=$(POSTGRES_OPTS="$opts" scripts/bench/postgres.sh start "$tmp/pg")
		for w in $workloads; do
			read -r -a model_args <<<"$(args_of "$w")"
			out=$tmp/run.out
			if ! bin/loadgen -stack bin/shardstock-dev -stack-args "-shard-servers 0 -allocator-shard" \
				-database-url "$url" -database-note "a private durable Postgres, $name" -target shardstock \
				"${model_args[@]}" "${rate_args[@]}" -concurrency 64 -duration "$duration" -progress=false >"$out" 2>&1; then
				cat "$out" >&2
				echo "pgsettings.sh: loadgen failed (round $r, $w, $name)" >&2
				exit 1
			fi
			# "shardstock: server 241µs = Go 158µs + Postgres 83µs, ..." and the table's row.
			cpu=$(sed -n 's/^ *shardstock: server \([0-9]*\)µs = Go \([0-9]*\)µs + Postgres \([0-9]*\)µs.*/\1 \2 \3/p' "$out")
			row=$(awk '$1 == "shardstock" && $2 ~ /^[0-9]+$/ { print $7, $8, $10 }' "$out")
			[[ -n $cpu && -n $row ]] || { cat "$out" >&2; echo "pgsettings.sh: no figures in loadgen's output" >&2; exit 1; }
			echo "$r $w $name $cpu $row" | tee -a "$results"
		done
	done
done

echo
echo "per set, the median over $rounds rounds of its server CPU per request against ${sets[0]%%=*}'s in the same round:"
base=${sets[0]%%=*}
for w in $workloads; do
	for s in "${sets[@]}"; do
		name=${s%%=*}
		awk -v w="$w" -v n="$name" -v b="$base" '
			$2 == w && $3 == b { base[$1] = $4 }
			$2 == w && $3 == n { cpu[$1] = $4 }
			END { for (r in cpu) if (r in base) printf "%.2f\n", cpu[r] / base[r] }' "$results" |
			sort -n | awk -v w="$w" -v n="$name" '
				{ v[NR] = $1; line = line " " $1 }
				END {
					med = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
					printf "  %-4s %-12s median %.2f (sorted:%s)\n", w, n, med, line
				}'
	done
done
