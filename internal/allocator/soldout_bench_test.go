package allocator_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/allocator"
	"github.com/shardstock/shardstock/internal/stock"
)

// BenchmarkSoldOutRefusal: what a deduct with a new key of a SKU sold out
// for good costs the allocator's process (its shard server is in it, as
// -shard-id runs one): by the sold-out check (no marks: what every
// allocator did before them) and from memory. cpu-µs/op is the process's
// user and system time per request; Postgres's share of the check is not
// in it (docs/benchmarks.md has it from the load generator).
//
//	go test -run '^$' -bench BenchmarkSoldOutRefusal -benchtime 3s ./internal/allocator/
func BenchmarkSoldOutRefusal(b *testing.B) {
	s := newStack(b, nil, "a1")
	ctx := context.Background()
	const sku = "bench-soldout"
	if _, err := s.alloc.CreateSKU(ctx, stock.SKU{Name: sku, Shards: 4}, 4); err != nil {
		b.Fatal(err)
	}
	for i := range 4 {
		if res := s.alloc.Allocate(ctx, deduct(sku, fmt.Sprint("sell-", i), 1)); res.Err != nil {
			b.Fatal(res.Err)
		}
	}
	checked, marked := s.newAllocator(), s.newMarked(s.db)
	// Wait for the mark and the keys: a refusal from memory.
	for i := 0; marked.MemoryRefusals() == 0; i++ {
		marked.Allocate(ctx, deduct(sku, fmt.Sprint("warm-", i), 1))
		time.Sleep(5 * time.Millisecond)
	}
	for _, bc := range []struct {
		name string
		a    *allocator.Allocator
	}{{"check", checked}, {"memory", marked}} {
		b.Run(bc.name, func(b *testing.B) {
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s-%d", bc.name, i)
			}
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				if res := bc.a.Allocate(ctx, deduct(sku, keys[i], 1)); res.Err == nil || res.Err.Code != stock.CodeOutOfStock {
					b.Fatalf("Allocate = %+v, want OUT_OF_STOCK", res)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
