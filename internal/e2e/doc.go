// Package e2e tests shardstock end to end: shard servers and an allocator
// as real processes, real Postgres, real (embedded) etcd, and real Connect,
// gRPC and gRPC-Web clients over HTTP/2. It has no code outside its tests.
package e2e
