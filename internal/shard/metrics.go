package shard

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
)

type metrics struct {
	batchSize     prometheus.Histogram
	groupSize     prometheus.Histogram
	groupDuration prometheus.Histogram
	batchDuration prometheus.Histogram
	results       *prometheus.CounterVec
	rejected      prometheus.Counter
	halted        prometheus.Counter
	divergences   *prometheus.CounterVec
	reruns        *prometheus.CounterVec
	haltedShards  *prometheus.GaugeVec
	// dueShards and staleTransfers are what the last sweep found: shards
	// with held reservations past their expiry, transfers left half-way.
	// Both are swept at once; staying above 0 means the sweep is stuck.
	dueShards, staleTransfers prometheus.Gauge
	// tokensRedeemed and tokensExpired count purchase tokens (issue 31)
	// ended by a committed write of this server: bought by a Commit, or
	// lapsed. Counted here because only the shard's writer sees an expiry
	// happen, and it sees each end once: a replayed Commit writes nothing.
	tokensRedeemed, tokensExpired prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, lostCommits func() stock.LostCommits, speculated func() (committed, fellBack int64)) *metrics {
	m := &metrics{
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shardstock_shard_batch_size", Help: "Requests per batch transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shardstock_shard_group_batches", Help: "Shard batches per group transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 8),
		}),
		groupDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shardstock_shard_group_seconds", Help: "Time of one group transaction (both round trips and the commit).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shardstock_shard_batch_seconds", Help: "Time to decide and commit one batch.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_shard_results_total", Help: "Shard results by code (OK for success).",
		}, []string{"code"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_shard_queue_rejected_total", Help: "Requests refused because a shard queue was full.",
		}),
		halted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_shard_halted_total", Help: "Shards halted after an invariant violation.",
		}),
		divergences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_shard_divergences_total",
			Help: "Shard rows found not to be their writer's copy, by outcome: recovered (reloaded; the ledger accounts for the row) or halted.",
		}, []string{"outcome"}),
		reruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardstock_shard_batch_reruns_total",
			Help: "Batches run again after an attempt failed, by cause: conflict (a concurrent batch took a key or a quota), not_committed (a divergence is in shardstock_shard_divergences_total).",
		}, []string{"cause"}),
		haltedShards: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shardstock_shard_halted",
			Help: "1 for each shard this server refuses as halted; GetStock shows the reason, AdminService.ResumeShard resumes it.",
		}, []string{"sku", "shard"}),
		dueShards: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardstock_shard_expiry_due_shards", Help: "Shards with held reservations past their expiry, as the last sweep found them (each is swept at once).",
		}),
		staleTransfers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardstock_shard_stale_transfers", Help: "Transfers left half-way past transferStaleAge, as the last sweep found them (each is finished at once).",
		}),
		tokensRedeemed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_admission_tokens_redeemed_total", Help: "Purchase tokens bought by a Commit, as this shard server's writers committed it.",
		}),
		tokensExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardstock_admission_tokens_expired_total", Help: "Purchase tokens that lapsed unbought, as this shard server's sweep expired them.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.dueShards, m.staleTransfers, m.tokensRedeemed, m.tokensExpired)
		reg.MustRegister(m.batchSize, m.groupSize, m.groupDuration, m.batchDuration, m.results, m.rejected, m.halted,
			m.divergences, m.reruns, m.haltedShards)
		lost := func(outcome string, get func(stock.LostCommits) int64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "shardstock_shard_lost_commits_total",
				Help:        "Group commits whose answer was lost, by what their commit mark showed: committed, voided (not committed), unknown (no answer in time).",
				ConstLabels: prometheus.Labels{"outcome": outcome},
			}, func() float64 { return float64(get(lostCommits())) })
		}
		reg.MustRegister(
			lost("committed", func(l stock.LostCommits) int64 { return l.Committed }),
			lost("voided", func(l stock.LostCommits) int64 { return l.Voided }),
			lost("unknown", func(l stock.LostCommits) int64 { return l.Unknown }))
		spec := func(outcome string, fellBack bool) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "shardstock_shard_speculative_groups_total",
				Help: "Groups decided before any read and sent in one round trip, by outcome: committed, or fell_back " +
					"(a key was not new, a SKU or a fence had changed; nothing was written and the group ran with its reads).",
				ConstLabels: prometheus.Labels{"outcome": outcome},
			}, func() float64 {
				c, f := speculated()
				if fellBack {
					return float64(f)
				}
				return float64(c)
			})
		}
		reg.MustRegister(spec("committed", false), spec("fell_back", true))
	}
	return m
}

func (m *metrics) observeBatch(n int, d time.Duration, results []stock.Result) {
	m.batchSize.Observe(float64(n))
	m.batchDuration.Observe(d.Seconds())
	for _, r := range results {
		code := "OK"
		if r.Err != nil {
			code = string(r.Err.Code)
		}
		m.results.WithLabelValues(code).Inc()
	}
}

// observeTokens counts the tokens a committed write ended. A token is a
// reservation whose reserve had an admission key, and the ledger entry of
// a reservation's end carries its reserve's key.
func (m *metrics) observeTokens(entries []*stock.LedgerEntry) {
	for _, e := range entries {
		if !stock.IsAdmissionKey(e.IdempotencyKey) {
			continue
		}
		switch e.Kind {
		case stock.OpCommit:
			m.tokensRedeemed.Inc()
		case stock.OpExpire:
			m.tokensExpired.Inc()
		}
	}
}
