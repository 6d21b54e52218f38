#!/usr/bin/env bash
# postgres.sh start DIR | stop DIR
#
# A private, durable Postgres for benchmarks: initdb into DIR/data (once),
# start it on a free port of 127.0.0.1 with the server's defaults (fsync and
# synchronous_commit on, like a production server) but max_connections=300,
# so that the dev stack (up to 112 connections) and the Postgres baselines
# (50 each) fit. `start` prints the connection URL on stdout; `stop` stops
# the server (fast shutdown) and leaves DIR to the caller.
#
# POSTGRES_OPTS adds server options to start's, e.g. "-c
# shared_preload_libraries=pg_stat_statements" (scripts/bench/statements.sh).
set -euo pipefail

readonly max_connections=300
readonly start_attempts_max=5
readonly ready_timeout_s=60

die() { echo "postgres.sh: $*" >&2; exit 1; }

bin_dir() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [[ -x $d/initdb && -x $d/postgres && -x $d/pg_ctl ]]; then echo "$d"; return; fi
	done
	command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return; }
	die "no PostgreSQL server binaries (initdb, postgres, pg_ctl); Debian: apt-get install postgresql"
}

# as runs a command as the postgres OS user when we are root (postgres
# refuses to run as root), else as ourselves.
as() {
	if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
	local dir=$1 bin port attempt
	bin=$(bin_dir)
	mkdir -p "$dir"
	[[ $(id -u) -eq 0 ]] && chown postgres: "$dir"
	if [[ ! -f $dir/data/PG_VERSION ]]; then
		as "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
			|| die "initdb failed: see $dir/initdb.log"
	fi
	for ((attempt = 1; attempt <= start_attempts_max; attempt++)); do
		port=$((20000 + RANDOM % 40000))
		# A port something answers on is taken; postgres would fail on it.
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
		if as "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t "$ready_timeout_s" \
			-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=$max_connections ${POSTGRES_OPTS:-}" start >/dev/null; then
			echo "$port" >"$dir/port"
			echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
			return
		fi
	done
	die "could not start postgres in $start_attempts_max attempts: see $dir/postgres.log"
}

stop() {
	local dir=$1
	[[ -f $dir/data/postmaster.pid ]] || return 0
	as "$(bin_dir)/pg_ctl" -D "$dir/data" -m fast -w -t "$ready_timeout_s" stop >/dev/null
}

case "${1:-}" in
start) [[ $# -eq 2 ]] || die "usage: postgres.sh start DIR"; start "$2" ;;
stop) [[ $# -eq 2 ]] || die "usage: postgres.sh stop DIR"; stop "$2" ;;
*) die "usage: postgres.sh start DIR | stop DIR" ;;
esac
