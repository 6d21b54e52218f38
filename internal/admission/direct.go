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
	read map[string]time.Time
}

// saw records an entry read of sku.
func (u *untickets) saw(sku string, c stock.EntryCounts) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if c.Ticketed {
		delete(u.read, sku)
		return
	}
	if u.read == nil {
		u.read = map[string]time.Time{}
	}
	if len(u.read) >= untickSKUsMax {
		for k, at := range u.read {
			if time.Since(at) >= stock.DirectTrustMax {
				delete(u.read, k)
			}
		}
		if len(u.read) >= untickSKUsMax {
			return
		}
	}
	if at, ok := u.read[sku]; !ok || c.ReadAt.After(at) {
		u.read[sku] = c.ReadAt
	}
}

// forget drops sku's read: its next requests read the counts.
func (u *untickets) forget(sku string) {
	u.mu.Lock()
	delete(u.read, sku)
	u.mu.Unlock()
}

// trusted reports whether sku was read never ticketed less than
// stock.DirectTrustMax ago.
func (u *untickets) trusted(sku string) bool {
	u.mu.Lock()
	at, ok := u.read[sku]
	u.mu.Unlock()
	return ok && time.Since(at) < stock.DirectTrustMax
}
