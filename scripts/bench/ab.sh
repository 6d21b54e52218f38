#!/usr/bin/env bash
# ab.sh BASE [ROUNDS]: `make bench-ab BASE=<commit>`. The same loads on two
# builds of the dev stack, alternated round by round, each run with the
# in-memory ceiling and the Connect-fronted Redis beside it: the working
# tree's build against BASE's (any git revision, built in a temporary
# worktree). The machine is shared and its speed moves by more than most
# changes do between runs minutes apart, so only ratios within a run are
# compared, and their medians over ROUNDS rounds (default 3) are printed.
#
# Workloads (BENCH_AB_WORKLOADS, default "hot rc C"): hot = one SKU of
# 1,000,000,000 units in 16 shards, deducts; rc = the same SKU, reserve
# then commit; C = model C. 64 clients, BENCH_DURATION (default 5s) per
# target; the stack is one allocator with its own shard server on
# DATABASE_URL (default 127.0.0.1:5432), Redis on 127.0.0.1:6379.
# BENCH_AB_STACK_ARGS sets the dev stack's flags instead, e.g. "" for
# `make run`'s (an allocator and three shard servers, each a process).
# BENCH_AB_RATE paces every target at that many requests a second (loadgen
# -rate) instead of as fast as 64 clients go: below every target's peak,
# each does the same work in each run, and the client's share of the
# cores is the same for both builds.
#
# Besides the medians of ratios to the ceiling, it prints the median of
# head/base per round: the two builds' runs of a round are minutes apart
# at most, the ceiling's and the build's seconds apart, so both are
# printed; an A/A run (BASE=HEAD on a clean tree) shows the noise floor.
set -euo pipefail

cd "$(dirname "$0")/../.."
[[ $# -ge 1 && -n $1 ]] || { echo "usage: $0 BASE [ROUNDS] (make bench-ab BASE=<git revision> [ROUNDS=N])" >&2; exit 2; }
readonly base=$1 rounds=${2:-3}
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "ab.sh: ROUNDS $rounds: want 1 to 99" >&2; exit 2; }
git rev-parse --verify --quiet "$base^{commit}" >/dev/null || { echo "ab.sh: BASE $base is not a git revision here" >&2; exit 2; }
readonly duration=${BENCH_DURATION:-5s}
readonly stack_args=${BENCH_AB_STACK_ARGS--shard-servers 0 -allocator-shard}
readonly workloads=${BENCH_AB_WORKLOADS:-hot rc C}
readonly url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
readonly rate=${BENCH_AB_RATE:-}
[[ -z $rate || $rate =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: BENCH_AB_RATE $rate: want a whole number of requests a second" >&2; exit 2; }

tmp=$(mktemp -d)
cleanup() {
	git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

args_of() {
	case $1 in
	hot) echo "-model A -skus 1 -stock 1000000000 -shards 16" ;;
	rc) echo "-model A -skus 1 -stock 1000000000 -shards 16 -mix deduct=0,commit=100" ;;
	C) echo "-model C" ;;
	*) echo "ab.sh: unknown workload $1" >&2; exit 2 ;;
	esac
}

for w in $workloads; do args_of "$w" >/dev/null; done # an unknown workload stops here, before any build

git worktree add --detach "$tmp/base" "$base" >/dev/null
(cd "$tmp/base" && go build -o "$tmp/base-dev" ./cmd/shardstock-dev)
go build -o "$tmp/head-dev" ./cmd/shardstock-dev
go -C bench build -o ../bin/loadgen ./cmd/loadgen

echo "ab.sh: base $(git rev-parse --short "$base") against the working tree on $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'); $rounds rounds of: $workloads; stack flags: ${stack_args:-none}; ${rate:-unpaced}${rate:+ requests a second}" >&2
for ((round = 1; round <= rounds; round++)); do
	for w in $workloads; do
		for build in base head; do
			read -r -a wargs <<<"$(args_of "$w")"
			echo "ab.sh: round $round, $w, $build ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
			bin/loadgen -stack "$tmp/$build-dev" -stack-args "$stack_args" -database-url "$url" \
				-target memory,shardstock,redis-api -concurrency 64 -duration "$duration" -progress=false ${rate:+-rate "$rate"} "${wargs[@]}" \
				>"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
			# One line per run: workload build ceiling-µs shardstock-µs redis-µs ceiling-req/s shardstock-req/s redis-req/s
			# shardstock-Go-µs shardstock-Postgres-µs round
			awk -v w="$w" -v b="$build" -v r="$round" '
				$1 ~ /^(memory|shardstock|redis-api)$/ && $2 ~ /^[0-9]+$/ { rps[$1] = $7 }
				$1 ~ /^(memory|shardstock|redis-api):$/ && $2 == "server" { t = $1; sub(":", "", t); v = $3; sub("µs,?", "", v); cpu[t] = v }
				$1 == "shardstock:" && $2 == "server" {
					for (i = 4; i < NF; i++) if ($i == "Go" || $i == "Postgres") { v = $(i+1); sub("µs,?", "", v); part[$i] = v }
				}
				/oversold [1-9]|undersold [1-9]|duplicates [1-9]|lost acknowledged [1-9]|reconciliation differences [1-9]/ { bad = 1 }
				END {
					if (bad) { print "ab.sh: a correctness number was not 0" > "/dev/stderr"; exit 1 }
					print w, b, cpu["memory"], cpu["shardstock"], cpu["redis-api"], rps["memory"], rps["shardstock"], rps["redis-api"], part["Go"], part["Postgres"], r
				}' "$tmp/out" >>"$tmp/runs"
		done
	done
done

echo
echo "medians over $rounds rounds (server CPU per request, and shardstock's as a multiple of the ceiling's and of the Connect-fronted Redis's in the same run):"
printf '%-4s %-5s %14s %7s %7s %10s %10s %13s %13s\n' load build "shardstock µs" "Go" "Postgres" "x ceiling" "x redis" "req/s x ceil" "req/s x redis"
for w in $workloads; do
	for build in base head; do
		awk -v w="$w" -v b="$build" '
			function median(a, n,   i, j, t) {
				for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
				return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
			}
			$1 == w && $2 == b { n++; us[n] = $4; xc[n] = $4 / $3; xr[n] = $4 / $5; tc[n] = $7 / $6; tr[n] = $7 / $8; g[n] = $9; pg[n] = $10 }
			END { if (n) printf "%-4s %-5s %14.0f %7.0f %7.0f %10.2f %10.2f %13.2f %13.2f\n", w, b, median(us, n), median(g, n), median(pg, n), median(xc, n), median(xr, n), median(tc, n), median(tr, n) }
		' "$tmp/runs"
	done
done
echo
echo "shardstock's server CPU per request, head / base, per round and their median:"
for w in $workloads; do
	awk -v w="$w" '
		function median(a, n,   i, j, t) {
			for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
			return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
		}
		$1 == w && $2 == "base" { base[$11] = $4 }
		$1 == w && $2 == "head" { head[$11] = $4; if ($11 > last) last = $11 }
		END {
			line = ""
			for (r = 1; r <= last; r++) if ((r in head) && (r in base) && base[r] > 0) { n++; x[n] = head[r] / base[r]; line = line sprintf(" %.2f", x[n]) }
			if (n) printf "%-4s median %.2f (rounds:%s)\n", w, median(x, n), line
		}
	' "$tmp/runs"
done
echo
echo "every run (load build ceiling-µs shardstock-µs redis-µs ceiling-req/s shardstock-req/s redis-req/s shardstock-Go-µs shardstock-Postgres-µs round):"
cat "$tmp/runs"
