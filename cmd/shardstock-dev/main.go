// Command shardstock-dev is `make run`: the whole stack on one machine
// (Postgres, etcd, three shard servers, an allocator and a demo SKU).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardstock/shardstock/internal/cmd/devcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := devcmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "shardstock-dev:", err)
		os.Exit(1)
	}
}
