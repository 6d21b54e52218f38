package allocator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// writers is how many shard writers run on the stack's servers.
func (s *stack) writers() float64 {
	s.t.Helper()
	var n float64
	for id := range s.servers {
		n += s.gauge(id, "shardstock_shard_writers")
	}
	return n
}

// skuGauge sums the stack's servers' samples of gauge name for a SKU.
func (s *stack) skuGauge(name, sku string) float64 {
	s.t.Helper()
	var n float64
	for id := range s.servers {
		mfs, err := s.metrics[id].Gather()
		if err != nil {
			s.t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "sku" && l.GetValue() == sku {
						n += m.GetGauge().GetValue()
					}
				}
			}
		}
	}
	return n
}

// testPrewarm (TestAllocator_Admin's, on its stack): Prewarm starts a
// writer for each of a SKU's shards, with its row and SKU loaded, so that
// the SKU's first deduct is decided before any read and committed in one
// round trip (speculative), as a warm SKU's are; a cold SKU's first deduct
// reads its rows first. Prewarm again changes nothing; an unknown SKU is
// SKU_NOT_FOUND.
func testPrewarm(t *testing.T, s *stack) {
	ctx := context.Background()
	s.createSKU("warm", 8, 800)
	s.createSKU("cold", 8, 800)
	writers := s.writers()
	for range 2 {
		st, warm, err := s.alloc.Prewarm(ctx, "warm")
		if err != nil || warm != 8 || st.Total.Available != 800 {
			t.Fatalf("Prewarm(warm) = %+v, %d, %v, want 8 shards warm and 800 available", st, warm, err)
		}
		if n := s.writers(); n != writers+8 {
			t.Fatalf("%v writers after Prewarm of 8 shards, want %v", n, writers+8)
		}
	}
	// oneTrip: the first deduct was committed in one round trip with
	// nothing read before it (a cold SKU's reads its rows first, or in its
	// transaction).
	first := func(sku string) (oneTrip bool) {
		t.Helper()
		before, _ := s.db.Speculated()
		readBefore := s.db.ReadFirst()
		if res := s.alloc.Allocate(ctx, deduct(sku, "first-"+sku, 1)); res.Err != nil {
			t.Fatalf("first Deduct(%s) = %v", sku, res.Err)
		}
		after, _ := s.db.Speculated()
		return after > before && s.db.ReadFirst() == readBefore
	}
	if got := s.skuGauge("shardstock_shard_available", "warm"); got != 800 {
		t.Errorf("shardstock_shard_available{sku=warm} sums to %v after Prewarm, want 800", got)
	}
	if !first("warm") {
		t.Errorf("the first deduct of a prewarmed SKU read before it wrote, want one round trip (speculative)")
	}
	if got := s.skuGauge("shardstock_shard_sold", "warm"); got != 1 {
		t.Errorf("shardstock_shard_sold{sku=warm} sums to %v after one deduct, want 1", got)
	}
	if first("cold") {
		t.Errorf("the first deduct of a cold SKU read nothing first: the test cannot tell a prewarmed SKU from a cold one")
	}
	if _, _, err := s.alloc.Prewarm(ctx, "nosuch"); stock.CodeOf(err) != stock.CodeSKUNotFound {
		t.Errorf("Prewarm(nosuch) = %v, want SKU_NOT_FOUND", err)
	}
	s.balanced("warm")
}

// BenchmarkAllocator_FirstDeduct measures a SKU's first deduct through an
// allocator and two shard servers over HTTP/2: cold (created, never
// called), after Prewarm, and a warm SKU's deducts for comparison. Each
// iteration creates a SKU of 8 shards, outside the timer.
//
//	go test -run '^$' -bench FirstDeduct -benchtime 40x ./internal/allocator/
func BenchmarkAllocator_FirstDeduct(b *testing.B) {
	ctx := context.Background()
	s := newStack(b, []string{"a", "b"}, "")
	n := 0
	create := func() string {
		n++
		name := fmt.Sprintf("bench-%05d", n)
		s.createSKU(name, 8, 1_000_000)
		return name
	}
	run := func(b *testing.B, prewarm bool) {
		var total time.Duration
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			sku := create()
			if prewarm {
				if _, _, err := s.alloc.Prewarm(ctx, sku); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			start := time.Now()
			if res := s.alloc.Allocate(ctx, deduct(sku, fmt.Sprintf("k-%d", i), 1)); res.Err != nil {
				b.Fatal(res.Err)
			}
			total += time.Since(start)
		}
		b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/first-deduct")
	}
	b.Run("Cold", func(b *testing.B) { run(b, false) })
	b.Run("Prewarmed", func(b *testing.B) { run(b, true) })
	b.Run("Warm", func(b *testing.B) {
		sku := create()
		for i := range 1000 {
			if res := s.alloc.Allocate(ctx, deduct(sku, fmt.Sprintf("w-%d", i), 1)); res.Err != nil {
				b.Fatal(res.Err)
			}
		}
		i := 0
		for b.Loop() {
			i++
			if res := s.alloc.Allocate(ctx, deduct(sku, fmt.Sprintf("k-%d", i), 1)); res.Err != nil {
				b.Fatal(res.Err)
			}
		}
	})
}
