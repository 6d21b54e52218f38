package shard_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
)

// BenchmarkHotShard measures deducts on one hot shard from 64 concurrent
// callers: the batched writer against the same writer capped at one request
// per transaction, in the same run on the same database. Compare ns/op of
// the two sub-benchmarks (docs/benchmarks.md).
func BenchmarkHotShard(b *testing.B) {
	db, _ := openDB(b)
	for _, bc := range []struct {
		name     string
		batchMax int
	}{{"per-request", 1}, {"batched", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			sku := fmt.Sprintf("bench-%s-%d", bc.name, benchRuns.Add(1)) // -count reruns share a database
			createSKU(b, db, stock.SKU{Name: sku, Shards: 1}, 1_000_000_000)
			reg := prometheus.NewRegistry()
			s := newServerWith(b, shard.Config{ServerID: sku, DB: db, Logger: testLogger(), Registerer: reg},
				func(s *shard.Server) { shard.SetBatchSizeMax(s, bc.batchMax) })
			acquire(b, s, sku, 1, 0)
			ctx := context.Background()
			var n atomic.Int64
			b.SetParallelism(32) // 64 callers on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					k := fmt.Sprintf("%s-%d-%d", sku, b.N, n.Add(1))
					if res := s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: k}); res.Err != nil {
						b.Errorf("Deduct = %v", res.Err)
						return
					}
				}
			})
			b.StopTimer()
			reportBatches(b, reg)
			if c := total(b, db, sku); c.Sold != n.Load() {
				b.Errorf("sold = %d, want %d", c.Sold, n.Load())
			}
		})
	}
}

// benchRuns numbers the benchmark's runs: each gets a SKU of its own.
var benchRuns atomic.Int64

// reportBatches reports the mean batch size and batch time.
func reportBatches(b *testing.B, reg *prometheus.Registry) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		h := mf.GetMetric()[0].GetHistogram()
		if h == nil || h.GetSampleCount() == 0 {
			continue
		}
		mean := h.GetSampleSum() / float64(h.GetSampleCount())
		switch mf.GetName() {
		case "shardstock_shard_batch_size":
			b.ReportMetric(mean, "reqs/batch")
		case "shardstock_shard_batch_seconds":
			b.ReportMetric(mean*1e3, "ms/batch")
		}
	}
}
