package allocator

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	// local and remote count the requests handed to the allocator's own
	// shard server and those sent to shard servers over RPC.
	local, remote prometheus.Counter
	checks        prometheus.Counter
	checkTime     prometheus.Histogram
	// reroutes counts shard calls to other shards than a request's first
	// choice: what skewed stock costs routing before any sold-out check.
	reroutes prometheus.Counter
	// replays counts reserves and deducts answered with their first
	// result (a client's retry); a surge means clients retry a lot.
	replays prometheus.Counter
	// ordersRecovered counts orders taken over from a driver that stopped.
	ordersRecovered *prometheus.CounterVec
	// reconciles counts Reconcile calls by result: balanced, unbalanced.
	reconciles *prometheus.CounterVec
	breaker    *prometheus.CounterVec
	// abandoned counts, by shard server, the calls its callers stopped
	// waiting for because their partition got a new owner.
	abandoned *prometheus.CounterVec
	// settles counts refusals held back because a shard may still apply
	// the request (Allocator.settleDoubt), by outcome: refused (the shards in
	// doubt refused it too), served (one of them served it) or unavailable
	// (one could not be asked: SHARD_UNAVAILABLE instead of the refusal).
	settles *prometheus.CounterVec
	// memoryRefusals counts reserves and deducts refused from memory (a
	// SKU marked sold out for good, a new key): no query, no shard call.
	memoryRefusals prometheus.Counter
	// marks counts the SKUs this allocator marked sold out for good;
	// reopenWaits the reopens that waited for every allocator to stop
	// trusting a mark; settledReopens the reopens another allocator left
	// that this one finished.
	marks, reopenWaits, settledReopens prometheus.Counter
	// calls and refused count, by shard server, the Execute calls its
	// breaker let through and those it refused.
	calls, refused *prometheus.CounterVec
}

// serverMetrics are the counters of one shard server's client.
type serverMetrics struct {
	abandoned, calls, refused prometheus.Counter
}

func (m *metrics) server(id string) serverMetrics {
	return serverMetrics{
		abandoned: m.abandoned.WithLabelValues(id),
		calls:     m.calls.WithLabelValues(id),
		refused:   m.refused.WithLabelValues(id),
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	paths := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardstock_allocator_shard_requests_total", Help: "Requests sent to shard servers, by path: local (this process's own shard server, no RPC) or rpc.",
	}, []string{"path"})
	m := &metrics{
		local:  paths.WithLabelValues("local"),
		remote: paths.WithLabelValues("rpc"),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_soldout_checks_total", Help: "Sold-out checks (one read of all of a SKU's shards and its stock in transit) before an OUT_OF_STOCK.",
		}),
		checkTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shardstock_allocator_soldout_check_seconds", Help: "Time of one sold-out check (the read of every shard of a SKU, and of the keys that joined it).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_replays_total", Help: "Reserves and deducts answered with their first result (replayed: a client's retry).",
		}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_reconcile_runs_total", Help: "Reconcile calls by result: balanced, or unbalanced (a discrepancy found: look at once).",
		}, []string{"result"}),
		reroutes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_reroutes_total", Help: "Shard calls made to another shard than the request's first choice (its stock was elsewhere).",
		}),
		breaker: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_breaker_transitions_total", Help: "Circuit breaker state changes by shard server.",
		}, []string{"server", "state"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_abandoned_calls_total", Help: "Calls to a shard server abandoned because their partition got a new owner (then sent to it).",
		}, []string{"server"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_settles_total", Help: "Refusals held back because a shard whose call failed after it reached it may still apply the request, by outcome: refused (asked again, it refused too), served (asked again, it served it), unavailable (it could not be asked: SHARD_UNAVAILABLE, retry with the same key, instead of the refusal).",
		}, []string{"outcome"}),
		memoryRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_soldout_memory_refusals_total", Help: "Reserves and deducts refused from memory: their SKU is marked sold out for good (nothing available, held or in transit) and no operation of the SKU has their key; no query, no shard call.",
		}),
		marks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_soldout_marks_total", Help: "SKUs this allocator marked sold out for good (in etcd, for every allocator).",
		}),
		reopenWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_soldout_reopen_waits_total", Help: "Replenishes and positive adjustments that took a sold-out mark away and waited until no allocator could trust it before adding stock.",
		}),
		settledReopens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_allocator_soldout_settled_reopens_total", Help: "Reopens left pending by another allocator (it died, or its request was in doubt) that this one sent again and finished.",
		}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_execute_calls_total", Help: "Execute calls sent to shard servers (let through by their circuit breaker).",
		}, []string{"server"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_execute_refused_total", Help: "Execute calls refused by a shard server's open or half-open circuit breaker.",
		}, []string{"server"}),
		ordersRecovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_allocator_orders_recovered_total", Help: "Orders whose driver's lease ran out, taken over by this allocator's recovery, by the state it found them in (pending: undone; committing, releasing: finished).",
		}, []string{"state"}),
	}
	if reg != nil {
		reg.MustRegister(paths, m.checks, m.checkTime, m.reroutes, m.replays, m.reconciles, m.breaker, m.abandoned, m.settles, m.calls, m.refused,
			m.ordersRecovered, m.memoryRefusals, m.marks, m.reopenWaits, m.settledReopens)
	}
	return m
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
