package allocator

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	sweeps         prometheus.Counter
	consolidations prometheus.Counter
	breaker        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_sweeps_total", Help: "Sweeps of all of a SKU's shards before an OUT_OF_STOCK.",
		}),
		consolidations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_consolidations_total", Help: "Consolidating transfers for requests larger than any one shard.",
		}),
		breaker: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_breaker_transitions_total", Help: "Circuit breaker state changes by shard server.",
		}, []string{"server", "state"}),
	}
	if reg != nil {
		reg.MustRegister(m.sweeps, m.consolidations, m.breaker)
	}
	return m
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
