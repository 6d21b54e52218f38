// Command allocator runs shardstock's public front door: InventoryService
// and AdminService over Connect, gRPC and gRPC-Web on one port, routing each
// request to the shard servers that etcd says own its shards.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardstock/shardstock/internal/cmd/allocatorcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := allocatorcmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "allocator:", err)
		os.Exit(1)
	}
}
