package transport

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestSKUCalls_Bounded: the set holds at most its bound of SKUs, the
// least recently called dropped first; a call that may not enter does
// not bring its SKU in, but is counted for a SKU already there; each
// SKU's families hold its own calls by reason and its latency buckets.
func TestSKUCalls_Bounded(t *testing.T) {
	const bound = 3
	c := NewSKUCalls(bound)
	const deduct = "/shardstock.v1.InventoryService/Deduct"
	for i := range 10 {
		c.Observe(fmt.Sprintf("sku-%d", i), deduct, "OK", 0.001, true)
		if got := c.Len(); got != min(i+1, bound) {
			t.Fatalf("after %d SKUs: Len() = %d, want %d", i+1, got, min(i+1, bound))
		}
	}
	// sku-7 is the least recently called: calling it again keeps it, and
	// sku-8 goes when sku-10 comes.
	c.Observe("sku-7", deduct, "OUT_OF_STOCK", 0.003, true)
	c.Observe("sku-10", deduct, "OK", 0.001, true)
	if f := c.Families([]string{"sku-8"}); len(f) != 0 {
		t.Errorf("Families(sku-8) after it was dropped = %v, want none", f)
	}
	// A name that is no SKU does not enter; a SKU in the set counts it.
	c.Observe("no-such", deduct, "SKU_NOT_FOUND", 0.001, false)
	c.Observe("sku-7", deduct, "RATE_LIMITED", 10, false)
	if f := c.Families([]string{"no-such"}); len(f) != 0 {
		t.Errorf("Families(no-such) = %v, want none: it may not enter", f)
	}
	fams := c.Families([]string{"sku-7", "sku-9"})
	if len(fams) != 2 || fams[0].GetName() != SKUCallsFamily || fams[1].GetName() != SKUSecondsFamily {
		t.Fatalf("Families = %v, want %s and %s", fams, SKUCallsFamily, SKUSecondsFamily)
	}
	calls := map[string]float64{}
	for _, m := range fams[0].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		calls[l["sku"]+"/"+l["reason"]] = m.GetCounter().GetValue()
	}
	want := map[string]float64{"sku-7/OK": 1, "sku-7/OUT_OF_STOCK": 1, "sku-7/RATE_LIMITED": 1, "sku-9/OK": 1}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("Families calls = %v, want %v", calls, want)
	}
	for _, m := range fams[1].GetMetric() {
		h := m.GetHistogram()
		var sku string
		for _, p := range m.GetLabel() {
			if p.GetName() == "sku" {
				sku = p.GetValue()
			}
		}
		wantCount := map[string]uint64{"sku-7": 3, "sku-9": 1}[sku]
		if h.GetSampleCount() != wantCount {
			t.Errorf("%s: latency count %d, want %d", sku, h.GetSampleCount(), wantCount)
		}
		// 0.001 s is in the bucket up to 0.0016; 10 s is above the last.
		under := float64(h.GetBucket()[3].GetCumulativeCount()) // 0.0002 * 2^3
		if wantUnder := map[string]float64{"sku-7": 1, "sku-9": 1}[sku]; under != wantUnder {
			t.Errorf("%s: %v calls up to 1.6 ms, want %v", sku, under, wantUnder)
		}
		if last := h.GetBucket()[len(h.GetBucket())-1].GetCumulativeCount(); sku == "sku-7" && last != 2 {
			t.Errorf("sku-7: %d calls up to the last bound, want 2 (10 s is above it)", last)
		}
	}
}

// BenchmarkSKUCalls is what counting by SKU adds to a call's metrics:
// "Procedure" is what every call already costs (the counter and the
// histogram by procedure); the others add SKUCalls.Observe, from every
// core at once (the set's one lock), over a few hot SKUs ("Hot") or over
// twice as many SKUs as the set holds, so that every call evicts one
// ("Churn"). Compare them within one run.
func BenchmarkSKUCalls(b *testing.B) {
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c", Help: "h"}, []string{"procedure", "reason"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h", Help: "h", Buckets: latencyBuckets}, []string{"procedure"})
	const deduct = "/shardstock.v1.InventoryService/Deduct"
	for _, bc := range []struct {
		name string
		skus int
	}{{"Procedure", 0}, {"Hot", 4}, {"Churn", 2 * skuCallsMax}} {
		skus := make([]string, bc.skus)
		for i := range skus {
			skus[i] = fmt.Sprintf("sku-%d", i)
		}
		c := NewSKUCalls(0)
		b.Run(bc.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					counter.WithLabelValues(deduct, "OK").Inc()
					latency.WithLabelValues(deduct).Observe(0.001)
					if len(skus) > 0 {
						c.Observe(skus[i%len(skus)], deduct, "OK", 0.001, true)
					}
				}
			})
		})
	}
}
