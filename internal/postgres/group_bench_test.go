package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/proccpu"
	"github.com/shardstock/shardstock/internal/stock"
)

// BenchmarkGroup is the write path's statement alone: one speculative
// group a op of units deducts, each on a cold SKU of its own (model A's
// and model C's cold SKUs: a group of one at a paced rate, of a dozen or
// more at the peak). It reports the CPU per group of the database's
// backends (pg-cpu-µs/op) and of this process (client-cpu-µs/op, the
// Group call: deciding, encoding, the round trip), which ns/op, a round
// trip with a commit to disk, hides.
func BenchmarkGroup(b *testing.B) {
	for _, units := range []int{1, 16} {
		b.Run(fmt.Sprintf("units=%d", units), func(b *testing.B) {
			ctx := context.Background()
			db, url := mustOpen(b)
			conn := connect(b, url)
			var ks []stock.ShardKey
			var fs []stock.Fence
			var skus []*stock.SKU
			parts := map[int32]bool{}
			for i := 0; len(ks) < units; i++ {
				k := stock.ShardKey{SKU: fmt.Sprintf("group-bench-%d", i)}
				if parts[k.Partition()] {
					continue // one owner a partition: a fence of its own each
				}
				parts[k.Partition()] = true
				createSKU(b, db, stock.SKU{Name: k.SKU, Shards: 1}, 1_000_000_000)
				f := stock.Fence{Partition: k.Partition(), Epoch: 7, ServerID: "srv"}
				if err := db.TakeOver(ctx, f.Partition, f.ServerID, f.Epoch); err != nil {
					b.Fatal(err)
				}
				sku, err := db.GetSKU(ctx, k.SKU)
				if err != nil {
					b.Fatal(err)
				}
				ks, fs, skus = append(ks, k), append(fs, f), append(skus, sku)
			}
			counts := make([]stock.Counts, units)
			for i := range counts {
				counts[i] = stock.Counts{Available: 1_000_000_000}
			}
			var d decision
			committed0, _ := db.Speculated()
			pg, self := pgtest.BackendsCPU(b, conn), proccpu.Self()
			b.ResetTimer()
			for i := range b.N {
				group := make([]*stock.Unit, units)
				for j := range group {
					key := fmt.Sprintf("k-%d-%d", i, j)
					group[j] = &stock.Unit{Fence: fs[j], Query: stock.BatchQuery{Shard: ks[j], Keys: []string{key}, KnownSKU: skus[j]},
						Decide: deductOne(ks[j], key, counts[j], false, &d)}
					counts[j] = counts[j].Add(stock.OpDeduct.Delta(1))
				}
				if err := db.Group(ctx, group); err != nil {
					b.Fatalf("Group = %v", err)
				}
			}
			b.StopTimer()
			per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(b.N) }
			b.ReportMetric(per(pgtest.BackendsCPU(b, conn)-pg), "pg-cpu-µs/op")
			b.ReportMetric(per(proccpu.Self()-self), "client-cpu-µs/op")
			if committed, fellBack := db.Speculated(); committed-committed0 != int64(b.N) || fellBack != 0 {
				b.Errorf("speculative groups: %d committed, %d fell back; want all %d in one round trip", committed-committed0, fellBack, b.N)
			}
		})
	}
}
