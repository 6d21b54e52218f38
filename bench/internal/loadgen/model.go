package loadgen

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/shardstock/shardstock/internal/stock"
)

// Model is a traffic model of the source document (section 四.2, its
// scenarios A, B and C; 八.4 asks for such models).
type Model string

// Traffic models.
const (
	// ModelA spreads requests uniformly over all SKUs.
	ModelA Model = "A"
	// ModelB sends 80% of requests to the hottest 20% of SKUs.
	ModelB Model = "B"
	// ModelC sends 70% of requests to one SKU that has only HotStock units;
	// the rest are spread over the other SKUs.
	ModelC Model = "C"
	// ModelSkew spreads requests uniformly over all SKUs, but every key's
	// first-choice shard (FNV-32a of the key mod the SKU's shards: where
	// the allocator sends it first) is one of SkewShards: demand lands on
	// a few shards while the stock starts spread over all.
	ModelSkew Model = "skew"
	// ModelCase is the source document's case (section 七.1): one SKU with
	// CaseStock units, CaseRequests deducts of one unit, CaseReusedKeys of
	// them reusing another request's idempotency key.
	ModelCase Model = "case"
	// ModelCart is checkout traffic (cart.go): each client operation is a
	// cart of CartLinesMin to CartLinesMax lines, held whole with
	// ReserveOrder, then bought with CommitOrder; CartRefundShare of the
	// paid orders are payment failures, each line refunded afterwards.
	ModelCart Model = "cart"
	// ModelDrop is a drop (package drop): a SKU of few units under
	// admission and a crowd asking for purchase tokens faster than the
	// service answers. The runner does not run it: cmd/loadgen does.
	ModelDrop Model = "drop"
)

// Constants of the models, as the source document gives them.
const (
	HotStock       = 100
	CaseStock      = 100
	CaseRequests   = 500
	CaseReusedKeys = 50
	hotShareB      = 0.8 // of requests, to hotSKUShareB of SKUs
	hotSKUShareB   = 0.2
	hotShareC      = 0.7
	// SkewShards is how many shards of each SKU model skew's keys ask
	// first.
	SkewShards = 2
)

// ParseModel parses a model name: A, B, C, skew, case, cart or drop.
func ParseModel(s string) (Model, error) {
	switch strings.ToLower(s) {
	case "a":
		return ModelA, nil
	case "b":
		return ModelB, nil
	case "c":
		return ModelC, nil
	case "skew":
		return ModelSkew, nil
	case "case":
		return ModelCase, nil
	case "cart":
		return ModelCart, nil
	case "drop":
		return ModelDrop, nil
	}
	return "", fmt.Errorf("loadgen: unknown model %q (want A, B, C, skew, case, cart or drop)", s)
}

// QtyDist is the quantity of each request: uniform in [Min, Max], fixed when
// Min == Max.
type QtyDist struct {
	Min, Max int64
}

// ParseQty parses "3" (fixed) or "1..5" (uniform).
func ParseQty(s string) (QtyDist, error) {
	lo, hi, ranged := strings.Cut(s, "..")
	minQ, err := strconv.ParseInt(strings.TrimSpace(lo), 10, 64)
	if err != nil {
		return QtyDist{}, fmt.Errorf("loadgen: quantity %q: want N or 1..K", s)
	}
	maxQ := minQ
	if ranged {
		if maxQ, err = strconv.ParseInt(strings.TrimSpace(hi), 10, 64); err != nil {
			return QtyDist{}, fmt.Errorf("loadgen: quantity %q: want N or 1..K", s)
		}
	}
	d := QtyDist{Min: minQ, Max: maxQ}
	return d, d.validate()
}

func (d QtyDist) validate() error {
	if d.Min < 1 || d.Max < d.Min || d.Max > stock.QuantityMax {
		return fmt.Errorf("loadgen: quantity %s: want 1 <= min <= max <= %d", d, stock.QuantityMax)
	}
	return nil
}

func (d QtyDist) String() string {
	if d.Min == d.Max {
		return strconv.FormatInt(d.Min, 10)
	}
	return fmt.Sprintf("%d..%d", d.Min, d.Max)
}

func (d QtyDist) draw(r *rand.Rand) int64 {
	if d.Min == d.Max {
		return d.Min
	}
	return d.Min + r.Int64N(d.Max-d.Min+1)
}

// Mix weighs the three client flows: deduct; reserve then commit; reserve
// then release.
type Mix struct {
	Deduct, Commit, Release int
}

// ParseMix parses "deduct=70,commit=20,release=10"; missing flows weigh 0.
func ParseMix(s string) (Mix, error) {
	var m Mix
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(val)
		if !ok || err != nil || n < 0 || n > 1_000_000 {
			return Mix{}, fmt.Errorf("loadgen: mix %q: want deduct=N,commit=N,release=N", s)
		}
		switch name {
		case "deduct":
			m.Deduct = n
		case "commit":
			m.Commit = n
		case "release":
			m.Release = n
		default:
			return Mix{}, fmt.Errorf("loadgen: mix %q: unknown flow %q (want deduct, commit or release)", s, name)
		}
	}
	return m, m.validate()
}

func (m Mix) validate() error {
	if m.Deduct < 0 || m.Commit < 0 || m.Release < 0 || m.Deduct+m.Commit+m.Release == 0 {
		return fmt.Errorf("loadgen: mix %s: weights must be >= 0 and not all 0", m)
	}
	return nil
}

func (m Mix) String() string {
	return fmt.Sprintf("deduct=%d,commit=%d,release=%d", m.Deduct, m.Commit, m.Release)
}

// flowKind is what one client does.
type flowKind uint8

const (
	flowDeduct  flowKind = iota // deduct
	flowCommit                  // reserve, then commit
	flowRelease                 // reserve, then release
)

func (m Mix) draw(r *rand.Rand) flowKind {
	n := r.IntN(m.Deduct + m.Commit + m.Release)
	switch {
	case n < m.Deduct:
		return flowDeduct
	case n < m.Deduct+m.Commit:
		return flowCommit
	}
	return flowRelease
}

// flow is one client operation of a run.
type flow struct {
	kind flowKind
	sku  int32
	key  string
	qty  int64
}

// plan is the SKUs of a run and how requests pick among them.
type plan struct {
	skus []SKUSpec
	// fixed, when set, is the whole list of flows (the case model).
	fixed []flow
	pick  func(r *rand.Rand) int32
	// skewed, when set, makes every key's first choice one of the first
	// SkewShards shards of shards.
	skewed bool
	shards int32
}

// key returns the key of the n-th flow: with skew, the first of base,
// base-1, base-2, ... whose first choice is below SkewShards (about
// shards/SkewShards tries).
func (p plan) key(base string) string {
	if !p.skewed || p.shards <= SkewShards {
		return base
	}
	for i := 0; ; i++ {
		k := base
		if i > 0 {
			k = base + "-" + strconv.Itoa(i)
		}
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%uint32(p.shards) < SkewShards {
			return k
		}
	}
}

func newPlan(c Config) plan {
	name := func(i int) string { return fmt.Sprintf("lg-%s-%05d", c.RunID, i) }
	if c.Model == ModelCase {
		return newCasePlan(c, name(0))
	}
	p := plan{skus: make([]SKUSpec, c.SKUs)}
	for i := range p.skus {
		p.skus[i] = SKUSpec{SKU: name(i), Stock: c.Stock, Shards: c.Shards}
	}
	n := int32(c.SKUs)
	switch c.Model {
	case ModelA:
		p.pick = func(r *rand.Rand) int32 { return r.Int32N(n) }
	case ModelSkew:
		p.pick = func(r *rand.Rand) int32 { return r.Int32N(n) }
		p.skewed, p.shards = true, c.Shards
	case ModelB:
		hot := max(1, int32(float64(n)*hotSKUShareB))
		p.pick = func(r *rand.Rand) int32 {
			if r.Float64() < hotShareB || hot == n {
				return r.Int32N(hot)
			}
			return hot + r.Int32N(n-hot)
		}
	case ModelCart:
		p.pick = cartPick(n)
	case ModelC:
		p.skus[0].Stock = HotStock
		p.pick = func(r *rand.Rand) int32 {
			if r.Float64() < hotShareC || n == 1 {
				return 0
			}
			return 1 + r.Int32N(n-1)
		}
	}
	return p
}

// newCasePlan lays out the source document's case: CaseRequests deducts of one
// unit on one SKU of CaseStock units, CaseReusedKeys of which reuse the key of
// another request, in random order.
func newCasePlan(c Config, sku string) plan {
	r := rand.New(rand.NewPCG(uint64(c.Seed), 0x6361736520))
	unique := CaseRequests - CaseReusedKeys
	flows := make([]flow, 0, CaseRequests)
	for i := range unique {
		flows = append(flows, flow{kind: flowDeduct, key: fmt.Sprintf("%s-case-%d", c.RunID, i), qty: 1})
	}
	for range CaseReusedKeys {
		flows = append(flows, flows[r.IntN(unique)])
	}
	r.Shuffle(len(flows), func(i, j int) { flows[i], flows[j] = flows[j], flows[i] })
	return plan{
		skus:  []SKUSpec{{SKU: sku, Stock: CaseStock, Shards: c.Shards}},
		fixed: flows,
	}
}
