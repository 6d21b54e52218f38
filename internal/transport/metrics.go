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
}

// NewMetrics registers the call metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardstock_rpc_calls_total", Help: "Calls by procedure and result reason (OK for success).",
	}, []string{"procedure", "reason"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shardstock_rpc_seconds", Help: "Call latency by procedure (of the calls admitted).",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
	}, []string{"procedure"})
	reg.MustRegister(calls, latency)
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
			calls.WithLabelValues(req.Spec().Procedure, reason).Inc()
			latency.WithLabelValues(req.Spec().Procedure).Observe(time.Since(start).Seconds())
			return resp, err
		}
	}
	return &Metrics{UnaryInterceptorFunc: intercept, calls: calls}
}

// Refused counts a call to procedure refused with reason before it
// reached the interceptors.
func (m *Metrics) Refused(procedure, reason string) {
	m.calls.WithLabelValues(procedure, reason).Inc()
}
