#!/usr/bin/env bash
# cold-skus.sh: `make bench-cold`. What a catalogue of cold SKUs costs a
# shard server: start-up time, memory and etcd keys with BENCH_SKUS (default
# 1,000,000) SKUs of one shard each, against the same stack with none.
#
# In a database of its own (created here, dropped at the end) it starts the
# dev stack once to migrate it, inserts the SKUs with SQL (their partitions
# computed as stock.PartitionOf does: FNV-32a of the SKU, a zero byte and the
# index, mod 256), then starts the stack again and measures: the time until
# /readyz (every partition owned), each shard server's resident memory, the
# etcd keys under /shardstock/, and a deduct on one cold SKU (its row
# loaded on first use). Postgres: 127.0.0.1:5432 (trust).
set -euo pipefail

cd "$(dirname "$0")/../.."
readonly skus=${BENCH_SKUS:-1000000}
readonly port=${BENCH_PORT:-18081}
readonly base=http://127.0.0.1:$port
readonly server='postgres://postgres@127.0.0.1:5432'
readonly db=cold_skus_$$
readonly url="$server/$db?sslmode=disable"
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
readonly token

go build -o bin/shardstock-dev ./cmd/shardstock-dev
mkdir -p tmp
stack_pid=""
stop_stack() {
	if [[ -n $stack_pid ]]; then
		kill -TERM "$stack_pid" 2>/dev/null || true
		wait "$stack_pid" 2>/dev/null || true
		stack_pid=""
	fi
	# Its children may outlive it by a moment: wait for the port to close.
	for _ in $(seq 1 300); do
		curl -fsS "$base/healthz" >/dev/null 2>&1 || return 0
		sleep 0.1
	done
}
cleanup() {
	stop_stack
	psql "$server/postgres" -XAtq -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_stack starts the dev stack and sets ready to the seconds until
# /readyz answered 200.
start_stack() {
	local t0
	t0=$(date +%s.%N)
	SHARDSTOCK_ADMIN_TOKEN=$token DATABASE_URL=$url SHARDSTOCK_REBALANCE=0 SHARDSTOCK_AUTO_SHARDS=0 \
		bin/shardstock-dev -addr "127.0.0.1:$port" >tmp/bench-cold-stack.log 2>&1 &
	stack_pid=$!
	for _ in $(seq 1 1200); do
		if curl -fsS "$base/readyz" >/dev/null 2>&1; then
			ready=$(echo "$(date +%s.%N) - $t0" | bc)
			return
		fi
		sleep 0.05
	done
	echo "cold: the stack was not ready in 60 s" >&2
	exit 1
}

# report prints the shard servers' resident memory and the etcd keys.
report() {
	local label=$1 ready=$2
	local rss
	rss=$(for pid in $(pgrep -f 'shardstock-dev shard -id'); do awk '/VmRSS/ {print $2}' "/proc/$pid/status"; done |
		awk '{ s += $1; n++; if ($1 > m) m = $1 } END { printf "%d shard servers, %.1f MiB resident each at most, %.1f MiB in all", n, m / 1024, s / 1024 }')
	local keys
	keys=$(curl -fsS -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $token" -d '{}' \
		"$base/shardstock.v1.AdminService/GetTopology" |
		python3 -c 'import json,sys; t=json.load(sys.stdin); print(len(t.get("owners", [])) + len(t.get("servers", [])) + len(t.get("moveLeases", [])) + (1 if t.get("placement") else 0))')
	echo "cold: $label: ready ${ready}s after start; $rss; $keys etcd keys (partition owners + servers + move leases + the placement)"
}

if curl -fsS "$base/healthz" >/dev/null 2>&1; then
	echo "cold: something already answers on $base; stop it or set BENCH_PORT" >&2
	exit 1
fi
psql "$server/postgres" -XAtq -c "CREATE DATABASE $db"
start_stack
report "0 SKUs" "$ready"
stop_stack

echo "cold: inserting $skus SKUs" >&2
t0=$SECONDS
psql "$url" -XAtq -v ON_ERROR_STOP=1 <<SQL
CREATE FUNCTION pg_temp.partition_of(sku text, idx int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS \$\$
DECLARE
	b bytea := convert_to(sku, 'UTF8') || '\\x00'::bytea || int4send(idx);
	h bigint := 2166136261;
BEGIN
	FOR i IN 0 .. length(b) - 1 LOOP
		h := ((h # get_byte(b, i)) * 16777619) % 4294967296;
	END LOOP;
	RETURN h % 256;
END \$\$;
INSERT INTO skus (sku, status, shards, shard_span, reservation_ttl_ms)
	SELECT 'cold-' || i, 'active', 1, 1, 900000 FROM generate_series(1, $skus) i;
INSERT INTO shards (sku, idx, partition, available, reserved, sold, opening_available)
	SELECT 'cold-' || i, 0, pg_temp.partition_of('cold-' || i, 0), 10, 0, 0, 10 FROM generate_series(1, $skus) i;
SQL
echo "cold: inserted in $((SECONDS - t0))s" >&2

start_stack
report "$skus SKUs" "$ready"
sku="cold-$(((RANDOM * 32768 + RANDOM) % skus + 1))"
t1=$(date +%s.%N)
curl -fsS -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $token" -d "{\"sku\":\"$sku\",\"quantity\":1,\"idempotencyKey\":\"cold-1\"}" \
	"$base/shardstock.v1.InventoryService/Deduct" >/dev/null
echo "cold: a deduct on $sku (its row loaded on first use) took $(echo "$(date +%s.%N) - $t1" | bc)s"
report "$skus SKUs, after one deduct" "$ready"
