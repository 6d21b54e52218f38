package loadgen

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"time"
)

//go:embed report.html
var reportHTML string

var reportTemplate = template.Must(template.New("report").Parse(reportHTML))

// Chart sizes, in SVG user units.
const (
	chartWidth    = 760
	chartHeight   = 220
	chartLeft     = 56
	chartRight    = 12
	chartTop      = 12
	chartBottom   = 32
	binsPerDecade = 10
)

type svgRect struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type svgText struct {
	X, Y   float64
	Anchor string
	Text   string
}

type svgLine struct {
	X1, Y1, X2, Y2 float64
}

type chart struct {
	Label         string // what it shows, for screen readers
	Width, Height int
	Rects         []svgRect
	Texts         []svgText
	Lines         []svgLine
}

type reportTarget struct {
	R         *Result
	Elapsed   string
	P50       string
	P95       string
	P99       string
	Max       string
	OOSP99    string
	Codes     string
	Ledger    []string
	Latency   chart
	PerSecond chart
	Disk      string // what the disk probe saw; "" without one
	Slow      chart  // answers over the latency goal, and the disk's stalls, over time
}

type reportData struct {
	Generated string
	Header    string
	Ratios    string
	Targets   []reportTarget
	Compare   chart
}

// WriteReport writes an HTML report of the results: per target the counts,
// the correctness line, a latency histogram and the throughput of every
// second, as inline SVG.
func WriteReport(w io.Writer, results []*Result) error {
	d := reportData{Generated: time.Now().UTC().Format(time.RFC3339), Ratios: Ratios(results)}
	if len(results) > 0 {
		d.Header = describe(results)
	}
	for _, r := range results {
		t := reportTarget{
			R:         r,
			Elapsed:   r.Elapsed.Round(time.Millisecond).String(),
			P50:       quantile(r.Latency, 50),
			P95:       quantile(r.Latency, 95),
			P99:       quantile(r.Latency, 99),
			Max:       maxLatency(r.Latency),
			OOSP99:    quantile(r.OutOfStockLatency, 99),
			Codes:     codes(r.ErrorsByCode),
			Latency:   latencyChart(r),
			PerSecond: perSecondChart(r),
			Disk:      diskText(r),
			Slow:      slowChart(r),
		}
		for i, s := range r.SKUs {
			if i == 3 {
				t.Ledger = append(t.Ledger, fmt.Sprintf("(%d more SKUs)", len(r.SKUs)-3))
				break
			}
			st := r.State.SKUs[s.SKU]
			t.Ledger = append(t.Ledger, fmt.Sprintf("%s: stock %d, available %d, reserved %d, sold %d, in transit %d; ledger %s; operations %d, distinct keys %d",
				s.SKU, s.Stock, st.Available, st.Reserved, st.Sold, st.InTransit, st.LedgerString(), st.Operations, st.DistinctKeys))
		}
		d.Targets = append(d.Targets, t)
	}
	d.Compare = compareChart(results)
	return reportTemplate.Execute(w, d)
}

func newChart(label string) chart { return chart{Label: label, Width: chartWidth, Height: chartHeight} }

func plotWidth() float64  { return chartWidth - chartLeft - chartRight }
func plotHeight() float64 { return chartHeight - chartTop - chartBottom }

// axes draws the frame and the y axis labels for values 0..top.
func (c *chart) axes(top float64, unit string) {
	x0, y0 := float64(chartLeft), float64(chartTop)+plotHeight()
	c.Lines = append(c.Lines, svgLine{x0, chartTop, x0, y0}, svgLine{x0, y0, x0 + plotWidth(), y0})
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		y := y0 - plotHeight()*float64(i)/4
		c.Texts = append(c.Texts, svgText{X: x0 - 4, Y: y + 4, Anchor: "end", Text: shortCount(v) + unit})
	}
}

// latencyChart is a histogram of latency over logarithmic bins, ten per
// decade of microseconds.
func latencyChart(r *Result) chart {
	c := newChart("latency histogram")
	h := r.Latency
	if h == nil || h.TotalCount() == 0 {
		return c
	}
	lo := math.Floor(math.Log10(float64(max(h.Min(), 1))))
	hi := math.Ceil(math.Log10(float64(max(h.Max(), 1)) + 1))
	if hi <= lo {
		hi = lo + 1
	}
	bins := make([]int64, int(hi-lo)*binsPerDecade)
	for _, bar := range h.Distribution() {
		if bar.Count == 0 {
			continue
		}
		i := int((math.Log10(float64(max(bar.From, 1))) - lo) * binsPerDecade)
		bins[min(max(i, 0), len(bins)-1)] += bar.Count
	}
	var top int64
	for _, n := range bins {
		top = max(top, n)
	}
	c.axes(float64(top), "")
	w := plotWidth() / float64(len(bins))
	y0 := float64(chartTop) + plotHeight()
	for i, n := range bins {
		if n == 0 {
			continue
		}
		hgt := plotHeight() * float64(n) / float64(top)
		from := math.Pow(10, lo+float64(i)/binsPerDecade)
		to := math.Pow(10, lo+float64(i+1)/binsPerDecade)
		c.Rects = append(c.Rects, svgRect{X: chartLeft + float64(i)*w, Y: y0 - hgt, W: math.Max(w-1, 1), H: hgt, Class: "lat",
			Title: fmt.Sprintf("%s to %s: %d", formatMicros(int64(from)), formatMicros(int64(to)), n)})
	}
	for d := 0; d <= int(hi-lo); d++ {
		x := chartLeft + float64(d*binsPerDecade)*w
		c.Lines = append(c.Lines, svgLine{x, y0, x, y0 + 4})
		c.Texts = append(c.Texts, svgText{X: x, Y: y0 + 18, Anchor: "middle", Text: formatMicros(int64(math.Pow(10, lo+float64(d))))})
	}
	return c
}

// perSecondChart stacks, for every second of the run, the answers by kind.
func perSecondChart(r *Result) chart {
	c := newChart("answers per second")
	if len(r.Seconds) == 0 {
		return c
	}
	var top int64
	for _, s := range r.Seconds {
		top = max(top, s.Requests)
	}
	if top == 0 {
		return c
	}
	c.axes(float64(top), "/s")
	w := plotWidth() / float64(len(r.Seconds))
	y0 := float64(chartTop) + plotHeight()
	for i, s := range r.Seconds {
		y := y0
		for _, part := range []struct {
			n     int64
			class string
		}{{s.OK, "ok"}, {s.Replayed, "replayed"}, {s.OutOfStock, "oos"}, {s.Errors, "err"}} {
			if part.n == 0 {
				continue
			}
			hgt := plotHeight() * float64(part.n) / float64(top)
			y -= hgt
			c.Rects = append(c.Rects, svgRect{X: chartLeft + float64(i)*w, Y: y, W: math.Max(w-1, 1), H: hgt, Class: part.class,
				Title: fmt.Sprintf("second %d: %d %s", i, part.n, part.class)})
		}
		if len(r.Seconds) <= 30 || i%5 == 0 {
			c.Texts = append(c.Texts, svgText{X: chartLeft + (float64(i)+0.5)*w, Y: y0 + 18, Anchor: "middle", Text: fmt.Sprint(i)})
		}
	}
	return c
}

// Bins of the slow-answer chart: at least slowBinWidthMin wide, at most
// slowBinsMax of them.
const (
	slowBinWidthMin = 100 * time.Millisecond
	slowBinsMax     = 300
)

// slowChart counts the answers over the latency goal by when they started,
// over the disk's stalls drawn as shaded spans: a slow answer that a stall
// held up starts just before or during one.
func slowChart(r *Result) chart {
	c := newChart("slow answers and disk stalls over time")
	if r.Config.LatencyGoal <= 0 || (len(r.Slow) == 0 && r.Disk == nil) || r.Elapsed <= 0 {
		return c
	}
	bin := max(slowBinWidthMin, r.Elapsed/slowBinsMax)
	bins := make([]int64, int(r.Elapsed/bin)+1)
	for _, sp := range r.Slow {
		bins[min(max(int(sp.Start/bin), 0), len(bins)-1)]++
	}
	top := int64(1)
	for _, n := range bins {
		top = max(top, n)
	}
	top = (top + 3) / 4 * 4 // the axis has four steps: whole counts
	c.axes(float64(top), "")
	span := float64(len(bins)) * float64(bin)
	x := func(d time.Duration) float64 { return chartLeft + plotWidth()*min(max(float64(d)/span, 0), 1) }
	y0 := float64(chartTop) + plotHeight()
	if r.Disk != nil {
		for _, w := range r.Disk.Stalls {
			from, to := w.Start.Sub(r.Started), w.End.Sub(r.Started)
			if to < 0 || from > time.Duration(span) {
				continue // a stall during setup or verification
			}
			c.Rects = append(c.Rects, svgRect{X: x(from), Y: chartTop, W: math.Max(x(to)-x(from), 1), H: plotHeight(), Class: "stall",
				Title: fmt.Sprintf("disk stall at %s: %s", from.Round(time.Millisecond), formatDuration(to-from))})
		}
	}
	w := plotWidth() / float64(len(bins))
	for i, n := range bins {
		if n == 0 {
			continue
		}
		hgt := plotHeight() * float64(n) / float64(top)
		c.Rects = append(c.Rects, svgRect{X: chartLeft + float64(i)*w, Y: y0 - hgt, W: math.Max(w-1, 1), H: hgt, Class: "slow",
			Title: fmt.Sprintf("%s: %d answers over %s", (time.Duration(i) * bin).Round(time.Millisecond), n, r.Config.LatencyGoal)})
	}
	for s := 0; time.Duration(s)*time.Second <= time.Duration(span); s += max(1, int(time.Duration(span)/time.Second/10)) {
		c.Texts = append(c.Texts, svgText{X: x(time.Duration(s) * time.Second), Y: y0 + 18, Anchor: "middle", Text: fmt.Sprintf("%ds", s)})
	}
	return c
}

// compareChart is one bar of throughput per target.
func compareChart(results []*Result) chart {
	c := newChart("throughput by target")
	if len(results) < 2 {
		return c
	}
	var top float64
	for _, r := range results {
		top = math.Max(top, r.Throughput())
	}
	if top == 0 {
		return c
	}
	c.axes(top, "/s")
	w := plotWidth() / float64(len(results))
	y0 := float64(chartTop) + plotHeight()
	for i, r := range results {
		hgt := plotHeight() * r.Throughput() / top
		class := "ok"
		if !r.Correctness.Clean() {
			class = "err"
		}
		c.Rects = append(c.Rects, svgRect{X: chartLeft + float64(i)*w + w*0.15, Y: y0 - hgt, W: w * 0.7, H: hgt, Class: class,
			Title: fmt.Sprintf("%s: %.0f req/s", r.Target, r.Throughput())})
		c.Texts = append(c.Texts, svgText{X: chartLeft + (float64(i)+0.5)*w, Y: y0 + 18, Anchor: "middle", Text: r.Target})
	}
	return c
}

func shortCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
