# lib.sh: sourced by the benchmark scripts that run loadgen against the dev
# stack on a private durable Postgres (scripts/bench/postgres.sh).

# private_pg_setup sets tmp to a new directory the postgres OS user can
# reach (its cluster goes in $tmp/pg), stops that cluster and removes the
# directory when the script exits, and builds the dev stack and loadgen
# into bin/.
private_pg_setup() {
	tmp=$(mktemp -d)
	chmod 755 "$tmp"
	trap private_pg_cleanup EXIT
	trap 'exit 130' INT TERM
	go build -o bin/shardstock-dev ./cmd/shardstock-dev
	go -C bench build -o ../bin/loadgen ./cmd/loadgen
}

private_pg_cleanup() {
	local rc=$?
	scripts/bench/postgres.sh stop "$tmp/pg" || true
	rm -rf "$tmp"
	exit "$rc"
}
