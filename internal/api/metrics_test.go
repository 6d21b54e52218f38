package api

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// TestAdminHandler_ReadMetrics reads a registry's counters, gauges and
// histograms as the text format writes them, only the families named, and
// refuses names that are not shardstock families.
func TestAdminHandler_ReadMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardstock_rpc_calls_total", Help: "h"}, []string{"procedure", "reason"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardstock_rpc_seconds", Help: "h", Buckets: []float64{0.001, 0.01}},
		[]string{"procedure"})
	depth := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardstock_shard_queue_depth", Help: "h"})
	reg.MustRegister(calls, latency, depth, collectors.NewGoCollector())
	calls.WithLabelValues("/d", "OK").Add(3)
	calls.WithLabelValues("/d", "OUT_OF_STOCK").Add(2)
	for _, v := range []float64{0.0005, 0.005, 0.005, 1} {
		latency.WithLabelValues("/d").Observe(v)
	}
	depth.Set(7)
	h := &AdminHandler{Metrics: reg}

	t.Run("OK", func(t *testing.T) {
		resp, err := h.ReadMetrics(ctx, connect.NewRequest(&v1.ReadMetricsRequest{
			Names: []string{"shardstock_rpc_calls_total", "shardstock_rpc_seconds", "shardstock_not_yet"}}))
		if err != nil {
			t.Fatalf("ReadMetrics = %v", err)
		}
		got := map[string]float64{}
		for _, s := range resp.Msg.GetSamples() {
			got[sampleKey(s)] = s.GetValue()
		}
		want := map[string]float64{
			`shardstock_rpc_calls_total{procedure="/d",reason="OK"}`:           3,
			`shardstock_rpc_calls_total{procedure="/d",reason="OUT_OF_STOCK"}`: 2,
			`shardstock_rpc_seconds_bucket{le="0.001",procedure="/d"}`:         1,
			`shardstock_rpc_seconds_bucket{le="0.01",procedure="/d"}`:          3,
			`shardstock_rpc_seconds_bucket{le="+Inf",procedure="/d"}`:          4,
			`shardstock_rpc_seconds_sum{procedure="/d"}`:                       1.0105,
			`shardstock_rpc_seconds_count{procedure="/d"}`:                     4,
		}
		if len(got) != len(want) {
			t.Errorf("ReadMetrics = %v, want %v", got, want)
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g < v-1e-9 || g > v+1e-9 {
				t.Errorf("ReadMetrics %s = %v (present %v), want %v", k, g, ok, v)
			}
		}
		if resp.Msg.GetReadAt() == nil {
			t.Errorf("ReadMetrics.ReadAt absent")
		}
	})
	for _, tc := range []struct {
		name  string
		names []string
	}{
		{"None", nil},
		{"TooMany", manyNames(readMetricsNamesMax + 1)},
		{"NotShardstock", []string{"go_goroutines"}},
		{"Selector", []string{`shardstock_rpc_calls_total{reason="OK"}`}},
		{"TooLong", []string{"shardstock_" + strings.Repeat("x", metricNameLenMax)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.ReadMetrics(ctx, connect.NewRequest(&v1.ReadMetricsRequest{Names: tc.names}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || wire.Reason(err) != string(stock.CodeInvalidArgument) {
				t.Errorf("ReadMetrics(%.40q) = %v (reason %q), want invalid_argument, INVALID_ARGUMENT", tc.names, err, wire.Reason(err))
			}
		})
	}
	t.Run("NoMetrics", func(t *testing.T) {
		_, err := (&AdminHandler{}).ReadMetrics(ctx, connect.NewRequest(&v1.ReadMetricsRequest{Names: []string{"shardstock_rpc_seconds"}}))
		if connect.CodeOf(err) != connect.CodeUnimplemented {
			t.Errorf("ReadMetrics without metrics = %v, want unimplemented", err)
		}
	})
}

// sampleKey writes a sample as the text format names it, labels sorted.
func sampleKey(s *v1.MetricSample) string {
	var labels []string
	for k, v := range s.GetLabels() {
		labels = append(labels, fmt.Sprintf("%s=%q", k, v))
	}
	slices.Sort(labels)
	return s.GetName() + "{" + strings.Join(labels, ",") + "}"
}

func manyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("shardstock_m%d", i)
	}
	return out
}
