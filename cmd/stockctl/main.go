// Command stockctl steers shardstock through its admin API: every admin
// call, stock and operation lookups, and a bulk import of SKUs from CSV.
// `stockctl help` lists the commands and the exit codes.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardstock/shardstock/internal/cmd/stockctlcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := stockctlcmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
