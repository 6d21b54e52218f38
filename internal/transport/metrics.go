package transport

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/wire"
)

// Metrics counts calls by procedure and reason and observes their
// latency: as a Connect interceptor, and through Refused for the calls an
// HTTP-level admission check refused before any interceptor ran.
type Metrics struct {
	connect.UnaryInterceptorFunc
	calls *prometheus.CounterVec
	// SKUs counts the inventory's calls by SKU too, for the SKUs called
	// most recently (skucalls.go); ReadMetrics serves them.
	SKUs *SKUCalls
}

// latencyBuckets are shardstock_rpc_seconds's: 0.2 ms doubling to 6.6 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0002, 2, 16)

// skuEntryRefused are the reasons of a call that does not bring its SKU
// into the per-SKU set (it is still counted if the SKU is there): a name
// that is no SKU, or a caller not allowed to call, could otherwise push
// the SKUs that sell out of the bounded set.
var skuEntryRefused = map[string]bool{
	"INVALID_SKU": true, "SKU_NOT_FOUND": true, "UNAUTHENTICATED": true, "PERMISSION_DENIED": true,
	connect.CodeUnauthenticated.String(): true, connect.CodePermissionDenied.String(): true, connect.CodeInvalidArgument.String(): true,
}

// NewMetrics registers the call metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardstock_rpc_calls_total", Help: "Calls by procedure and result reason (OK for success).",
	}, []string{"procedure", "reason"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shardstock_rpc_seconds", Help: "Call latency by procedure (of the calls admitted).",
		Buckets: latencyBuckets,
	}, []string{"procedure"})
	reg.MustRegister(calls, latency)
	skus := NewSKUCalls(0)
	intercept := func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			start := time.Now()
			resp, err := next(ctx, req)
			reason := "OK"
			if err != nil {
				if reason = wire.Reason(err); reason == "" {
					reason = connect.CodeOf(err).String()
				}
			}
			procedure, seconds := req.Spec().Procedure, time.Since(start).Seconds()
			calls.WithLabelValues(procedure, reason).Inc()
			latency.WithLabelValues(procedure).Observe(seconds)
			if sku := skuOf(procedure, req.Any()); sku != "" {
				skus.Observe(sku, procedure, reason, seconds, !skuEntryRefused[reason])
			}
			return resp, err
		}
	}
	return &Metrics{UnaryInterceptorFunc: intercept, calls: calls, SKUs: skus}
}

// Refused counts a call to procedure refused with reason before it
// reached the interceptors.
func (m *Metrics) Refused(procedure, reason string) {
	m.calls.WithLabelValues(procedure, reason).Inc()
}
