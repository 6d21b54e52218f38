package transport

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/wire"
)

// NewMetrics returns an interceptor that counts calls by procedure and
// reason and observes their latency.
func NewMetrics(reg prometheus.Registerer) connect.UnaryInterceptorFunc {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardstock_rpc_calls_total", Help: "Calls by procedure and result reason (OK for success).",
	}, []string{"procedure", "reason"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "shardstock_rpc_seconds", Help: "Call latency by procedure.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
	}, []string{"procedure"})
	reg.MustRegister(calls, latency)
	return func(next connect.UnaryFunc) connect.UnaryFunc {
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
}
