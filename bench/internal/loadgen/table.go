package loadgen

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// RatioBase is the target that throughput ratios compare against: baseline
// (2), one row with an atomic conditional UPDATE per request.
const RatioBase = "onerow"

// Columns of the table, in order.
var Columns = []string{
	"target", "requests", "ok", "out-of-stock", "replayed", "errors", "req/s",
	"p50", "p95", "p99", "max", "oos-p99",
	"oversold", "undersold", "duplicates", "lost", "recon-diffs", "verdict",
}

// Verdict is "ok" for a clean run, "FAIL" for a target that broke a
// correctness rule, and "reported" for a baseline that did (a baseline may
// oversell or duplicate: the table reports what it did).
func (r *Result) Verdict() string {
	switch {
	case r.Correctness.Clean():
		return "ok"
	case r.Baseline:
		return "reported"
	}
	return "FAIL"
}

// WriteTable writes the results as one table, then the errors by code, the
// throughput ratios against RatioBase (when it ran beside others) and the
// lines explaining every non-zero correctness number.
func WriteTable(w io.Writer, results []*Result) error {
	var b strings.Builder
	if len(results) > 0 {
		b.WriteString(describe(results) + "\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(Columns, "\t")+"\t")
	for _, r := range results {
		c := r.Correctness
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			r.Target, r.Requests, r.OK, r.OutOfStock, r.Replayed, r.Errors, r.Throughput(),
			quantile(r.Latency, 50), quantile(r.Latency, 95), quantile(r.Latency, 99), maxLatency(r.Latency),
			quantile(r.OutOfStockLatency, 99),
			c.Oversold, c.Undersold, c.Duplicates, c.Lost, c.Reconciliation, r.Verdict())
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	b.WriteString("errors by code:\n")
	for _, r := range results {
		fmt.Fprintf(&b, "  %s: %s\n", r.Target, codes(r.ErrorsByCode))
		for _, c := range sortedKeys(r.ErrorSamples) {
			fmt.Fprintf(&b, "    %s: %q\n", c, r.ErrorSamples[c])
		}
	}
	for _, r := range results {
		if r.Config.Rate > 0 {
			fmt.Fprintf(&b, "paced: %s started at most %s (it reached %.0f ops/s)\n", r.Target, rateText(r.Config.Rate), r.FlowRate())
		}
	}
	if ratios := Ratios(results); ratios != "" {
		fmt.Fprintf(&b, "throughput against %s (baseline 2): %s\n", RatioBase, ratios)
	}
	writeCPU(&b, results)
	writeCart(&b, results)
	writeDisk(&b, results)
	writeCrashes(&b, results)
	b.WriteString("correctness:\n")
	for _, r := range results {
		c := r.Correctness
		cart := ""
		if r.Cart != nil {
			cart = fmt.Sprintf(", orders half held %d, refunded beyond their sale %d", c.HalfHeld, c.RefundBeyondSale)
		}
		fmt.Fprintf(&b, "  %s: oversold %d, undersold %d (%d false sold-outs), duplicates %d, lost acknowledged %d, reconciliation differences %d%s, unresolved %d: %s\n",
			r.Target, c.Oversold, c.Undersold, c.FalseSoldOut, c.Duplicates, c.Lost, c.Reconciliation, cart, c.Unresolved, verdictText(r))
		for _, d := range c.Details {
			fmt.Fprintf(&b, "    %s\n", d)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// CeilingTarget is the in-memory server's target name: the API's ceiling,
// against which writeCPU states every other run's server CPU and
// throughput.
const CeilingTarget = "memory"

// FrontedRedisTarget is the Connect-fronted Redis's target name: the same
// API, handlers and front as shardstock's over a Redis script, against
// which writeCPU states shardstock's server CPU per request.
const FrontedRedisTarget = "redis-api"

// writeCPU writes the CPU per answered request of each run that measured
// it: the server side's (what carries to a deployment where the client is
// elsewhere) and the load generator's own; and, when the in-memory ceiling
// ran unpaced in the same table, each other unpaced run's server CPU per
// request and throughput as multiples of the ceiling's.
func writeCPU(b *strings.Builder, results []*Result) {
	ceiling := measuredAtPeak(results, CeilingTarget)
	header := false
	for _, r := range results {
		c := r.CPU
		if c == nil {
			continue
		}
		if !header {
			b.WriteString("cpu per answered request (server: the target's processes and its database's, from /proc; client: this load generator):\n")
			header = true
		}
		if c.Err != nil {
			fmt.Fprintf(b, "  %s: server not measured (%v); client %s\n", r.Target, c.Err, perRequest(c.Client, r.Requests))
			continue
		}
		split := ""
		for i, p := range c.Parts {
			sep := " = "
			if i > 0 {
				sep = " + "
			}
			split += sep + p.Name + " " + perRequest(p.Time, r.Requests)
		}
		fmt.Fprintf(b, "  %s: server %s%s, client %s (%s)%s\n", r.Target, perRequest(c.Server, r.Requests), split, perRequest(c.Client, r.Requests), c.Procs, againstCeiling(r, ceiling))
	}
	writeAgainstRedis(b, results)
}

// measuredAtPeak is the last unpaced run of target in results whose
// server CPU was measured, or nil.
func measuredAtPeak(results []*Result, target string) *Result {
	var found *Result
	for _, r := range results {
		if r.Target == target && r.Config.Rate == 0 && r.CPU != nil && r.CPU.Err == nil && r.Requests > 0 {
			found = r
		}
	}
	return found
}

// writeAgainstRedis writes shardstock's server CPU per request and
// throughput as multiples of the Connect-fronted Redis's, when both ran
// unpaced in the table with their server side measured.
func writeAgainstRedis(b *strings.Builder, results []*Result) {
	s, f := measuredAtPeak(results, "shardstock"), measuredAtPeak(results, FrontedRedisTarget)
	if s == nil || f == nil || f.CPU.Server <= 0 || f.Throughput() == 0 {
		return
	}
	per := func(x *Result) float64 { return float64(x.CPU.Server) / float64(x.Requests) }
	fmt.Fprintf(b, "shardstock against the Connect-fronted Redis (%s): %.2fx its server CPU per request, %.2fx its req/s\n", FrontedRedisTarget, per(s)/per(f), s.Throughput()/f.Throughput())
}

// writeCart writes the cart model's figures: orders and order lines bought
// per second of load, and the server CPU per order line bought (every call
// of the run counted: holds, commits, refused carts and refunds).
func writeCart(b *strings.Builder, results []*Result) {
	for _, r := range results {
		k := r.Cart
		if k == nil {
			continue
		}
		secs := r.Elapsed.Seconds()
		if secs <= 0 {
			continue
		}
		fmt.Fprintf(b, "cart: %s: %d orders sent, %d held, %d refused, %d bought (%.0f orders/s) of %d lines (%.0f order lines/s); %d lines of %d orders refunded",
			r.Target, k.Orders, k.Held, k.Refused, k.Committed, float64(k.Committed)/secs, k.Lines, float64(k.Lines)/secs, k.Refunds, k.RefundedOrders)
		if r.CPU != nil && r.CPU.Err == nil && k.Lines > 0 {
			fmt.Fprintf(b, "; server CPU per order line %s", perRequest(r.CPU.Server, k.Lines))
		}
		b.WriteString("\n")
	}
}

// againstCeiling is r's server CPU per request and throughput as multiples
// of the ceiling's, or "" when there is nothing to compare: no ceiling, r
// is it, r was paced (a paced run measures latency, not cost at peak), or
// r is one of the five baselines, whose logic runs in this load generator
// and whose server side is only a database, not a server of the API.
func againstCeiling(r, ceiling *Result) string {
	if ceiling == nil || r == ceiling || r.Baseline || r.Config.Rate != 0 || r.Requests == 0 || ceiling.CPU.Server <= 0 || ceiling.Throughput() == 0 {
		return ""
	}
	per := func(x *Result) float64 { return float64(x.CPU.Server) / float64(x.Requests) }
	return fmt.Sprintf(": %.2fx the ceiling's server CPU per request, %.2fx its req/s", per(r)/per(ceiling), r.Throughput()/ceiling.Throughput())
}

// perRequest is d spread over n requests, in microseconds.
func perRequest(d time.Duration, n int64) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fµs", float64(d.Microseconds())/float64(n))
}

// writeDisk writes what the disk probe saw in each run that had one, and how
// the run's answers over its latency goal fell against the disk's stalls.
func writeDisk(b *strings.Builder, results []*Result) {
	header := false
	for _, r := range results {
		d := r.Disk
		if d == nil {
			continue
		}
		if !header {
			fmt.Fprintf(b, "disk (a write of 8 KiB and an fdatasync every few ms in %s; a stall is a sync of %s or more):\n", d.Dir, d.Threshold)
			header = true
		}
		fmt.Fprintf(b, "  %s: %s\n", r.Target, diskText(r))
	}
}

// diskText is one line of what the disk probe saw during r; "" without one.
func diskText(r *Result) string {
	d := r.Disk
	if d == nil {
		return ""
	}
	var b strings.Builder
	kept := ""
	if d.StallsDropped > 0 {
		kept = fmt.Sprintf(" (%d kept)", len(d.Stalls))
	}
	fmt.Fprintf(&b, "%d syncs, p50 %s, p99 %s, max %s; %d stalls%s, %s in all",
		d.Syncs, formatDuration(d.P50), formatDuration(d.P99), formatDuration(d.Max),
		int64(len(d.Stalls))+d.StallsDropped, kept, formatDuration(d.StallTime()))
	if d.Err != nil {
		fmt.Fprintf(&b, " (probe error: %v)", d.Err)
	}
	if r.Config.LatencyGoal > 0 {
		m := r.MatchSlow(d.Stalls)
		fmt.Fprintf(&b, "; answers over %s: %d, %d of them awaited across a stall", r.Config.LatencyGoal, m.Slow, m.InWindows)
		// Without every stall, some slow answers may be set aside too few.
		if m.Exact && d.StallsDropped == 0 && d.Err == nil {
			fmt.Fprintf(&b, "; p99 without those %s", formatDuration(m.P99Rest))
		}
	}
	return b.String()
}

// describe is one line of the parameters of a table's runs: the first's,
// with every shard count used when they differ.
func describe(results []*Result) string {
	r := results[0]
	c := r.Config
	shards := fmt.Sprint(c.Shards)
	seen := map[int32]bool{c.Shards: true}
	for _, o := range results[1:] {
		if !seen[o.Config.Shards] {
			seen[o.Config.Shards] = true
			shards += fmt.Sprintf(",%d", o.Config.Shards)
		}
	}
	stockText := fmt.Sprint(c.Stock)
	if c.Model == ModelC {
		stockText += fmt.Sprintf(" (hot SKU %d)", HotStock)
	}
	// The cart model has no mix: its flows are carts.
	mix := "mix " + c.Mix.String()
	if c.Model == ModelCart {
		mix = fmt.Sprintf("carts of %d to %d lines, %g%% refunded", CartLinesMin, CartLinesMax, CartRefundShare*100)
	}
	return fmt.Sprintf("model %s, %d SKUs, stock %s, shards %s, concurrency %d, duration %s, requests %s, rate %s, qty %s, %s, dup-rate %g, abandon-rate %g, retry %t, seed %d, run %s",
		c.Model, len(r.SKUs), stockText, shards, c.Concurrency, c.Duration, countOrNone(c.Requests), rateText(c.Rate),
		c.Qty, mix, c.DupRate, c.AbandonRate, c.Retry, c.Seed, c.RunID)
}

func rateText(rate float64) string {
	if rate <= 0 {
		return "unpaced"
	}
	return fmt.Sprintf("%.0f ops/s", rate)
}

func verdictText(r *Result) string {
	switch r.Verdict() {
	case "ok":
		return "all zero"
	case "reported":
		return "NOT zero (a baseline: reported as it is)"
	}
	return "NOT zero: FAIL"
}

// Ratios formats each unpaced target's throughput against RatioBase's
// (unpaced too), or returns "" when RatioBase did not run beside another
// target. A paced run measures latency below the peak, not the peak.
func Ratios(results []*Result) string {
	var base *Result
	for _, r := range results {
		if r.Target == RatioBase && r.Config.Rate == 0 {
			base = r
		}
	}
	if base == nil || len(results) < 2 || base.Throughput() == 0 {
		return ""
	}
	var parts []string
	for _, r := range results {
		if r != base && r.Config.Rate == 0 {
			parts = append(parts, fmt.Sprintf("%s %.2fx", r.Target, r.Throughput()/base.Throughput()))
		}
	}
	return strings.Join(parts, ", ")
}

func codes(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := sortedKeys(m)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func countOrNone(n int64) string {
	if n == 0 {
		return "unbounded"
	}
	return fmt.Sprint(n)
}

func quantile(h *hdrhistogram.Histogram, q float64) string {
	if h == nil || h.TotalCount() == 0 {
		return "-"
	}
	return formatMicros(h.ValueAtQuantile(q))
}

func maxLatency(h *hdrhistogram.Histogram) string {
	if h == nil || h.TotalCount() == 0 {
		return "-"
	}
	return formatMicros(h.Max())
}

func formatDuration(d time.Duration) string { return formatMicros(d.Microseconds()) }

// formatMicros formats a latency in microseconds: 850µs, 1.25ms, 2.10s.
func formatMicros(us int64) string {
	d := time.Duration(us) * time.Microsecond
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", us)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(us)/1e3)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// Crashes is what a database crash loop did during a run's load: how many
// crash-restarts it planned and made, and how long the database took to
// answer again after each.
type Crashes struct {
	What             string // how the database was crashed, for the table
	Every            time.Duration
	Planned, Done    int
	DownMin, DownMax time.Duration // from a crash to the database answering again
	Errors           []string      // crash-restarts that failed
}

// Short reports whether fewer crash-restarts happened than were planned: a
// run under fewer faults than it claims.
func (c *Crashes) Short() bool { return c != nil && c.Done < c.Planned }

// writeCrashes writes, for each run under a crash loop, how many crashes it
// actually had: a run without its faults must not read as one with them.
func writeCrashes(b *strings.Builder, results []*Result) {
	header := false
	for _, r := range results {
		c := r.Crashes
		if c == nil {
			continue
		}
		if !header {
			fmt.Fprintf(b, "database crash-restarts during the load (%s):\n", c.What)
			header = true
		}
		fmt.Fprintf(b, "  %s: %d of %d planned, every %s", r.Target, c.Done, c.Planned, c.Every)
		if c.Done > 0 {
			fmt.Fprintf(b, "; answered again %s to %s after each crash", c.DownMin.Round(time.Millisecond), c.DownMax.Round(time.Millisecond))
		}
		if c.Short() {
			b.WriteString(": FEWER THAN PLANNED")
		}
		b.WriteString("\n")
		for _, e := range c.Errors {
			fmt.Fprintf(b, "    %s\n", e)
		}
	}
}
