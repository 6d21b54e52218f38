package transport

import (
	"container/list"
	"slices"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// Per-SKU call figures. A label per SKU on shardstock_rpc_calls_total
// would give Prometheus a series per SKU, procedure and reason (and 17 per
// SKU and procedure for the histogram): with 10,000 SKUs, millions of
// series, kept by every scrape for as long as the SKU exists. A sale's
// dashboard needs the figures of the few SKUs selling now, read by
// AdminService.ReadMetrics: so each process keeps them in memory, for the
// skuCallsMax SKUs called most recently, and never exports them on
// /metrics (docs/architecture.md).
const (
	// skuCallsMax bounds the SKUs kept: about 2 KB each with a few
	// procedures and reasons, so at most a few MB.
	skuCallsMax = 1024
	// SKUCallsFamily and SKUSecondsFamily are the families ReadMetrics
	// serves them as.
	SKUCallsFamily   = "shardstock_sku_calls_total"
	SKUSecondsFamily = "shardstock_sku_rpc_seconds"
	// skuCallsPrefix: only the inventory's calls are counted by SKU (the
	// sale's calls; an admin's or a reader's calls would push selling SKUs
	// out of the bounded set).
	skuCallsPrefix = "/shardstock.v1.InventoryService/"
)

// skuBuckets are the latency buckets of the per-SKU histogram: those of
// shardstock_rpc_seconds, so that the two read alike.
var skuBuckets = latencyBuckets

// SKUCalls counts calls and their latency by SKU, for a bounded set of
// the SKUs called most recently (least recently called dropped first).
// Safe for concurrent use.
type SKUCalls struct {
	mu   sync.Mutex
	skus map[string]*list.Element // of *skuCalls
	lru  list.List                // front: the most recently called
	max  int
}

// skuCalls are one SKU's figures.
type skuCalls struct {
	sku     string
	calls   map[callKey]uint64
	latency map[string]*skuHistogram // by procedure
}

type callKey struct{ procedure, reason string }

type skuHistogram struct {
	counts []uint64 // by bucket, not cumulative; the last is +Inf
	sum    float64
}

// NewSKUCalls returns an empty set that keeps at most max SKUs
// (skuCallsMax if max <= 0).
func NewSKUCalls(max int) *SKUCalls {
	if max <= 0 {
		max = skuCallsMax
	}
	return &SKUCalls{skus: map[string]*list.Element{}, max: max}
}

// Observe counts one call of procedure on sku that ended with reason
// after seconds. A SKU not in the set enters it if enter is true,
// dropping the least recently called one if the set is full; otherwise
// the call is not counted by SKU.
func (c *SKUCalls) Observe(sku, procedure, reason string, seconds float64, enter bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s *skuCalls
	if e, ok := c.skus[sku]; ok {
		c.lru.MoveToFront(e)
		s = e.Value.(*skuCalls)
	} else {
		if !enter {
			return
		}
		if c.lru.Len() >= c.max {
			// The least recently called SKU's entry becomes sku's, its
			// maps and buckets kept: a call that evicts allocates nothing.
			oldest := c.lru.Back()
			s = oldest.Value.(*skuCalls)
			delete(c.skus, s.sku)
			s.sku = sku
			clear(s.calls)
			for _, h := range s.latency {
				clear(h.counts)
				h.sum = 0
			}
			c.lru.MoveToFront(oldest)
			c.skus[sku] = oldest
		} else {
			s = &skuCalls{sku: sku, calls: map[callKey]uint64{}, latency: map[string]*skuHistogram{}}
			c.skus[sku] = c.lru.PushFront(s)
		}
	}
	s.calls[callKey{procedure, reason}]++
	h := s.latency[procedure]
	if h == nil {
		h = &skuHistogram{counts: make([]uint64, len(skuBuckets)+1)}
		s.latency[procedure] = h
	}
	i := 0
	for i < len(skuBuckets) && seconds > skuBuckets[i] {
		i++
	}
	h.counts[i]++
	h.sum += seconds
}

// Len is how many SKUs the set holds.
func (c *SKUCalls) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Families returns the figures of skus (those in the set) as the metric
// families SKUCallsFamily and SKUSecondsFamily, each labelled sku and
// procedure (and reason, or le), in the form prometheus.Gatherer returns.
// A family with no sample is left out.
func (c *SKUCalls) Families(skus []string) []*dto.MetricFamily {
	calls := &dto.MetricFamily{Name: proto.String(SKUCallsFamily), Type: dto.MetricType_COUNTER.Enum(),
		Help: proto.String("Calls by SKU, procedure and result reason, of the SKUs called most recently (ReadMetrics only).")}
	seconds := &dto.MetricFamily{Name: proto.String(SKUSecondsFamily), Type: dto.MetricType_HISTOGRAM.Enum(),
		Help: proto.String("Call latency by SKU and procedure, of the SKUs called most recently (ReadMetrics only).")}
	label := func(name, value string) *dto.LabelPair {
		return &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sku := range skus {
		e, ok := c.skus[sku]
		if !ok {
			continue
		}
		s := e.Value.(*skuCalls)
		for k, n := range s.calls {
			calls.Metric = append(calls.Metric, &dto.Metric{
				Label:   []*dto.LabelPair{label("procedure", k.procedure), label("reason", k.reason), label("sku", sku)},
				Counter: &dto.Counter{Value: proto.Float64(float64(n))},
			})
		}
		for procedure, h := range s.latency {
			if !slices.ContainsFunc(h.counts, func(n uint64) bool { return n > 0 }) {
				continue // kept from an evicted SKU's calls
			}
			hist := &dto.Histogram{SampleSum: proto.Float64(h.sum)}
			var cum uint64
			for i, ub := range skuBuckets {
				cum += h.counts[i]
				hist.Bucket = append(hist.Bucket, &dto.Bucket{UpperBound: proto.Float64(ub), CumulativeCount: proto.Uint64(cum)})
			}
			cum += h.counts[len(skuBuckets)]
			hist.SampleCount = proto.Uint64(cum)
			seconds.Metric = append(seconds.Metric, &dto.Metric{
				Label:     []*dto.LabelPair{label("procedure", procedure), label("sku", sku)},
				Histogram: hist,
			})
		}
	}
	var out []*dto.MetricFamily
	for _, f := range []*dto.MetricFamily{calls, seconds} {
		if len(f.Metric) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// skuOf is the SKU a call names, if it is one of the inventory's calls
// and its request has a SKU.
func skuOf(procedure string, msg any) string {
	if !strings.HasPrefix(procedure, skuCallsPrefix) {
		return ""
	}
	if m, ok := msg.(interface{ GetSku() string }); ok {
		return m.GetSku()
	}
	return ""
}
