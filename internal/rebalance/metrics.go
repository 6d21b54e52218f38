package rebalance

import "github.com/prometheus/client_golang/prometheus"

// metrics are the rebalancer's; their names are those they had when it ran
// inside the allocator package, which dashboards and alerts know.
type metrics struct {
	leasesHeld       prometheus.Gauge
	plans            *prometheus.CounterVec // by policy
	transfersStarted *prometheus.CounterVec // by policy
	transfersEnded   *prometheus.CounterVec // by outcome: credited, or the code that stopped it
	inTransit        prometheus.Gauge
	unitsMoved       prometheus.Counter
	reshards         *prometheus.CounterVec // by direction (split, merge) and by (set, auto)
	retirements      prometheus.Counter
	consolidations   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardstock_rebalancer_leases_held", Help: "SKU move leases this allocator holds now.",
		}),
		plans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_rebalancer_plans_total", Help: "Plans carried out, by policy (drain, tail, refill, consolidate).",
		}, []string{"policy"}),
		transfersStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_rebalancer_transfers_started_total", Help: "Transfers created, by policy.",
		}, []string{"policy"}),
		transfersEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_rebalancer_transfers_ended_total", Help: "Transfers this allocator saw end, by outcome: credited, or the code that stopped it (OUT_OF_STOCK and MOVE_FENCED abort it; others leave it to the sweep).",
		}, []string{"outcome"}),
		inTransit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardstock_rebalancer_units_in_transit", Help: "Units of this allocator's transfers between their debit and their credit.",
		}),
		unitsMoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_rebalancer_units_moved_total", Help: "Units moved by transfers this allocator completed.",
		}),
		reshards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_rebalancer_reshards_total", Help: "Changes of a SKU's shard count, by direction (split, merge) and by whom (set: SetShards; auto: the automatic split and merge).",
		}, []string{"direction", "by"}),
		retirements: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_rebalancer_retirements_total", Help: "SKUs whose shards out of service finished retiring.",
		}),
		consolidations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_consolidations_total", Help: "Consolidating transfers for requests larger than any one shard.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.leasesHeld, m.plans, m.transfersStarted, m.transfersEnded, m.inTransit, m.unitsMoved, m.reshards, m.retirements, m.consolidations)
	}
	return m
}
