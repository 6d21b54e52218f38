package admission

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

func drawIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("tkt_%032x", uint64(i)*0x9e3779b97f4a7c15)
	}
	return ids
}

func drawSeed(i uint64) (seed [DrawSeedLen]byte) {
	binary.BigEndian.PutUint64(seed[:], i)
	binary.BigEndian.PutUint64(seed[24:], ^i)
	return seed
}

// TestDrawOrder_Replay: the same seed and the same set of tickets, in any
// order, give the same draw; the draw is a permutation of the tickets; a
// different seed gives a different draw.
func TestDrawOrder_Replay(t *testing.T) {
	ids := drawIDs(1000)
	seed := drawSeed(7)
	first := DrawOrder(seed, ids)
	shuffled := slices.Clone(ids)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if again := DrawOrder(seed, shuffled); !slices.Equal(again, first) {
		t.Fatalf("DrawOrder(seed, the same tickets in another order) = %v..., want %v...", again[:5], first[:5])
	}
	if !slices.Equal(ids, drawIDs(1000)) {
		t.Fatalf("DrawOrder changed its argument")
	}
	sorted := slices.Sorted(slices.Values(first))
	if !slices.Equal(sorted, slices.Sorted(slices.Values(ids))) {
		t.Fatalf("DrawOrder is not a permutation of its tickets")
	}
	if other := DrawOrder(drawSeed(8), ids); slices.Equal(other, first) {
		t.Fatalf("DrawOrder with another seed = the same order")
	}
	if got := DrawOrder(seed, nil); len(got) != 0 {
		t.Fatalf("DrawOrder(seed, nil) = %v, want none", got)
	}
}

// chiSquaredUpper is the value a chi-squared variable with k degrees of
// freedom exceeds with probability alpha, by the Wilson-Hilferty
// approximation (within a fraction of a percent for k in the hundreds):
// z is the standard normal's upper alpha quantile.
func chiSquaredUpper(k float64, z float64) float64 {
	c := 2 / (9 * k)
	return k * math.Pow(1-c+z*math.Sqrt(c), 3)
}

// TestDrawOrder_KnownAnswer pins the draw's algorithm: a seed of bytes 0
// to 31 over twelve tickets gives this order. A draw recorded today must
// replay the same after any change of Go or of this code, so a change
// that fails this test breaks every recorded draw's audit.
func TestDrawOrder_KnownAnswer(t *testing.T) {
	var seed [DrawSeedLen]byte
	for i := range seed {
		seed[i] = byte(i)
	}
	var ids []string
	for i := range 12 {
		ids = append(ids, fmt.Sprintf("t%02d", i))
	}
	want := []string{"t04", "t02", "t10", "t05", "t06", "t03", "t08", "t07", "t01", "t00", "t09", "t11"}
	if got := DrawOrder(seed, ids); !slices.Equal(got, want) {
		t.Fatalf("DrawOrder = %q, want %q: the draw's algorithm changed, and recorded draws would no longer replay", got, want)
	}
}

// TestDrawOrder_Uniform: over 2,000 draws with distinct seeds of 1,000
// registrations for 100 units (one unit each: the first 100 drawn win),
// every ticket wins about as often. Each ticket's wins are a sum of 2,000
// Bernoulli(p = 0.1) draws; scaled by the variance n·p·(1-p), the sum of the
// squared deviations is chi-squared with 999 degrees of freedom (the wins
// sum to 200,000: one constraint). The test fails at significance 0.001;
// the seeds are fixed, so it passes or fails the same way every run.
func TestDrawOrder_Uniform(t *testing.T) {
	const (
		tickets = 1000
		units   = 100
		draws   = 2000
		// zAlpha is the standard normal's upper 0.001 quantile.
		zAlpha = 3.0902323061678132
	)
	ids := drawIDs(tickets)
	index := make(map[string]int, tickets)
	for i, id := range ids {
		index[id] = i
	}
	wins := make([]float64, tickets)
	for d := range draws {
		for _, id := range DrawOrder(drawSeed(uint64(d)), ids)[:units] {
			wins[index[id]]++
		}
	}
	p := float64(units) / tickets
	mean, variance := draws*p, draws*p*(1-p)
	var stat float64
	for _, w := range wins {
		stat += (w - mean) * (w - mean) / variance
	}
	limit := chiSquaredUpper(tickets-1, zAlpha)
	t.Logf("chi-squared = %.1f, limit at 0.001 with %d degrees of freedom = %.1f", stat, tickets-1, limit)
	if stat > limit {
		t.Fatalf("wins per ticket: chi-squared %.1f > %.1f: the draw is not uniform", stat, limit)
	}
}

// TestGetDraw_BadInput: GetDraw refuses a bad SKU, a negative page token
// and a page outside its bounds with INVALID_ARGUMENT (or the SKU's code)
// before it reads anything: the service here has no store and no seller.
func TestGetDraw_BadInput(t *testing.T) {
	s := &Service{}
	for _, tc := range []struct {
		name    string
		sku     string
		after   int64
		pageLen int
		want    stock.Code
	}{
		{"EmptySKU", "", 0, 0, stock.CodeInvalidSKU},
		{"LongSKU", strings.Repeat("s", 1000), 0, 0, stock.CodeInvalidSKU},
		{"NegativeAfter", "drop", -1, 0, stock.CodeInvalidArgument},
		{"NegativePage", "drop", 0, -1, stock.CodeInvalidArgument},
		{"HugePage", "drop", 0, drawPageLenMax + 1, stock.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.GetDraw(context.Background(), tc.sku, tc.after, tc.pageLen); stock.CodeOf(err) != tc.want {
				t.Fatalf("GetDraw(%q, %d, %d) = %v, want %s", tc.sku, tc.after, tc.pageLen, err, tc.want)
			}
		})
	}
}
