package api

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// readMetricsNamesMax bounds the families of one ReadMetrics call: the
// dashboard reads about a dozen, and a bound keeps one call's answer small.
const readMetricsNamesMax = 32

// readMetricsSKUsMax bounds the SKUs whose per-SKU figures one call
// reads: the dashboard charts one SKU at a time and shows four.
const readMetricsSKUsMax = 4

// metricNameLenMax bounds one family name (the longest shardstock has is
// under 70 characters).
const metricNameLenMax = 128

// metricsPrefix is the prefix of every family ReadMetrics reads: the
// service's own, not the Go runtime's or the process's, which say more of
// the host than an admin's page needs.
const metricsPrefix = "shardstock_"

// ReadMetrics reads the families named from h.Metrics, histograms as
// their _bucket, _sum and _count samples.
func (h *AdminHandler) ReadMetrics(_ context.Context, req *connect.Request[v1.ReadMetricsRequest]) (*connect.Response[v1.ReadMetricsResponse], error) {
	if h.Metrics == nil {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeUnimplemented, "this server exposes no metrics"))
	}
	names := req.Msg.GetNames()
	if err := validMetricNames(names); err != nil {
		return nil, wire.ToConnect(err)
	}
	skus := req.Msg.GetSkus()
	if len(skus) > readMetricsSKUsMax {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "name at most %d SKUs", readMetricsSKUsMax))
	}
	for _, sku := range skus {
		if err := stock.ValidateSKU(sku); err != nil {
			return nil, wire.ToConnect(err)
		}
	}
	families, err := h.Metrics.Gather()
	if err != nil {
		// Gather returns what it could with the error: a family that failed
		// (a gauge whose database read failed) is left out, the rest shown.
		if len(families) == 0 {
			return nil, wire.ToConnect(stock.Errorf(stock.CodeInternal, "read metrics: %v", err))
		}
	}
	wanted := make(map[string]bool, len(names))
	for _, n := range names {
		wanted[n] = true
	}
	out := &v1.ReadMetricsResponse{ReadAt: timestamppb.New(time.Now())}
	if len(skus) > 0 && h.SKUCalls != nil {
		families = append(families, h.SKUCalls.Families(skus)...)
	}
	for _, f := range families {
		if wanted[f.GetName()] {
			out.Samples = append(out.Samples, familySamples(f)...)
		}
	}
	return connect.NewResponse(out), nil
}

// validMetricNames refuses an empty or too long list, and a name that is
// not a shardstock family name.
func validMetricNames(names []string) error {
	if len(names) == 0 || len(names) > readMetricsNamesMax {
		return stock.Errorf(stock.CodeInvalidArgument, "name 1 to %d metric families", readMetricsNamesMax)
	}
	for _, n := range names {
		if len(n) > metricNameLenMax || !strings.HasPrefix(n, metricsPrefix) || strings.IndexFunc(n, notMetricRune) >= 0 {
			return stock.Errorf(stock.CodeInvalidArgument, "metric %.*q: want a family name starting %s (letters, digits and _, at most %d)",
				metricNameLenMax, n, metricsPrefix, metricNameLenMax)
		}
	}
	return nil
}

func notMetricRune(r rune) bool {
	return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
}

// familySamples are f's samples as the text format writes them.
func familySamples(f *dto.MetricFamily) []*v1.MetricSample {
	var out []*v1.MetricSample
	name := f.GetName()
	for _, m := range f.GetMetric() {
		labels := make(map[string]string, len(m.GetLabel())+1)
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		sample := func(suffix string, v float64, extra ...string) {
			ls := labels
			if len(extra) == 2 {
				ls = make(map[string]string, len(labels)+1)
				for k, v := range labels {
					ls[k] = v
				}
				ls[extra[0]] = extra[1]
			}
			out = append(out, &v1.MetricSample{Name: name + suffix, Labels: ls, Value: v})
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			sample("", m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			sample("", m.GetGauge().GetValue())
		case dto.MetricType_UNTYPED:
			sample("", m.GetUntyped().GetValue())
		case dto.MetricType_HISTOGRAM:
			hist := m.GetHistogram()
			for _, b := range hist.GetBucket() {
				if math.IsInf(b.GetUpperBound(), 1) {
					continue // written below from the count, as always
				}
				sample("_bucket", float64(b.GetCumulativeCount()), "le", formatLe(b.GetUpperBound()))
			}
			sample("_bucket", float64(hist.GetSampleCount()), "le", "+Inf")
			sample("_sum", hist.GetSampleSum())
			sample("_count", float64(hist.GetSampleCount()))
		case dto.MetricType_SUMMARY:
			s := m.GetSummary()
			for _, q := range s.GetQuantile() {
				sample("", q.GetValue(), "quantile", fmt.Sprint(q.GetQuantile()))
			}
			sample("_sum", s.GetSampleSum())
			sample("_count", float64(s.GetSampleCount()))
		}
	}
	return out
}

// formatLe writes a bucket bound as the text format does.
func formatLe(v float64) string { return fmt.Sprint(v) }
