package admission

import (
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// untickSKUsMax bounds the SKUs whose never-ticketed reads are kept; a
// read lapses after stock.DirectTrustMax, so the lapsed go first.
const untickSKUsMax = 4096

// untickets remembers, per SKU, when the last entry read that found it
// never ticketed (stock.EntryCounts.Ticketed false) began. For
// stock.DirectTrustMax after that moment the SKU has no ticket at all, in
// any process: its first ticket is entered only after its flag is
// committed and DirectTrustMax and a margin have passed
// (postgres.flagTicketed). So a request with no ticket by its key and no
// ticket queued, the two things the entry read checks before a direct
// grant, may be granted directly without that read: at a drop's opening
// every process reads each SKU once every DirectTrustMax, not once per
// batch of requests (docs/admission.md, "Direct grants").
type untickets struct {
	mu   sync.Mutex
	skus map[string]untick
}

// untick is one SKU's: the last read that found it never ticketed began
// at read; forgot is when this process last stopped trusting it (a
// direct reserve found no unit), before which no read is trusted again.
type untick struct {
	read, forgot time.Time
}

// saw records an entry read of sku.
func (u *untickets) saw(sku string, c stock.EntryCounts) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if c.Ticketed {
		// Untrusted; a forget is kept, so that an older read arriving
		// late is not trusted again.
		if k, ok := u.skus[sku]; ok {
			u.skus[sku] = untick{forgot: k.forgot}
		}
		return
	}
	if u.skus == nil {
		u.skus = map[string]untick{}
	}
	k, ok := u.skus[sku]
	if !ok && len(u.skus) >= untickSKUsMax {
		for name, k := range u.skus {
			if time.Since(k.read) >= stock.DirectTrustMax && time.Since(k.forgot) >= stock.DirectTrustMax {
				delete(u.skus, name)
			}
		}
		if len(u.skus) >= untickSKUsMax {
			return
		}
	}
	// A read that began before the last forget (a batch in flight then)
	// is not trusted: its requests went direct, and the next enter in line.
	if c.ReadAt.After(k.read) && c.ReadAt.After(k.forgot) {
		k.read = c.ReadAt
		u.skus[sku] = k
	}
}

// forget stops trusting sku's reads until one begins after now: its next
// requests read the counts.
func (u *untickets) forget(sku string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.skus == nil {
		u.skus = map[string]untick{}
	}
	if _, ok := u.skus[sku]; ok || len(u.skus) < untickSKUsMax {
		u.skus[sku] = untick{forgot: time.Now()}
	}
}

// trusted reports whether sku was read never ticketed less than
// stock.DirectTrustMax ago, and not forgotten since (a forget clears the
// read, and saw keeps none from before it).
func (u *untickets) trusted(sku string) bool {
	u.mu.Lock()
	read := u.skus[sku].read
	u.mu.Unlock()
	return time.Since(read) < stock.DirectTrustMax
}
