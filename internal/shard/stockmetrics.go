package shard

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
)

// shardsReportedMax bounds the shards whose counts one scrape reports: a
// shard has a writer only if touched in about the last writerIdleMax, so these
// are the SKUs selling now; past the bound the rest go unreported rather
// than make a scrape (and Prometheus) pay for a million series.
const shardsReportedMax = 10_000

// The counts of the shards with a writer (running or parked), by SKU and
// shard: the business figures of a sale (stock left, holds, sold) beside
// the technical ones, for the dashboards (deploy/grafana). A shard appears
// while it has a writer; sum by (sku) gives a SKU's counts on this server.
var (
	availableDesc = prometheus.NewDesc("shardstock_shard_available",
		"Available units of each shard with a writer, as of its last commit.", []string{"sku", "shard"}, nil)
	reservedDesc = prometheus.NewDesc("shardstock_shard_reserved",
		"Reserved (held) units of each shard with a writer, as of its last commit.", []string{"sku", "shard"}, nil)
	soldDesc = prometheus.NewDesc("shardstock_shard_sold",
		"Sold units of each shard with a writer, as of its last commit.", []string{"sku", "shard"}, nil)
)

// stockCollector reports the counts of a server's writers at each scrape.
type stockCollector struct{ s *Server }

func (c stockCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- availableDesc
	ch <- reservedDesc
	ch <- soldDesc
}

func (c stockCollector) Collect(ch chan<- prometheus.Metric) {
	type shardCounts struct {
		key stock.ShardKey
		c   stock.Counts
	}
	c.s.mu.Lock()
	out := make([]shardCounts, 0, min(len(c.s.writers), shardsReportedMax))
	for k, w := range c.s.writers {
		if len(out) == shardsReportedMax {
			break
		}
		if cur := w.committed.Load(); cur != nil {
			out = append(out, shardCounts{k, *cur})
		}
	}
	c.s.mu.Unlock()
	for _, sc := range out {
		idx := strconv.Itoa(int(sc.key.Index))
		ch <- prometheus.MustNewConstMetric(availableDesc, prometheus.GaugeValue, float64(sc.c.Available), sc.key.SKU, idx)
		ch <- prometheus.MustNewConstMetric(reservedDesc, prometheus.GaugeValue, float64(sc.c.Reserved), sc.key.SKU, idx)
		ch <- prometheus.MustNewConstMetric(soldDesc, prometheus.GaugeValue, float64(sc.c.Sold), sc.key.SKU, idx)
	}
}
