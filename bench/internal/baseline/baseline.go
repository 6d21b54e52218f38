// Package baseline holds the systems that shardstock is measured against,
// as loadgen Targets driven by the same client on the same Postgres and
// Redis:
//
//  1. naive: the source document's 误区一 (section 三.1), SELECT the stock, decide in the
//     client, UPDATE without a condition, in separate statements;
//  2. onerow: one row per SKU, one transaction per request: an idempotency
//     record, a conditional UPDATE (available >= q) and a ledger row;
//  3. subrows: as (2) over N rows per SKU, without batching;
//  4. redis and redis-fsync: one Lua script per request (SET NX the key,
//     check and DECRBY, XADD a ledger entry), without and with
//     appendfsync always.
//
// A baseline may oversell or apply a key twice: the load generator reports
// what it did rather than failing the run. Each Postgres baseline works in a
// schema of its own and the Redis one under a key prefix of its own; Setup
// creates them and Close removes them.
package baseline
