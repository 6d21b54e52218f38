package admission

import (
	"context"
	"hash/fnv"

	"github.com/shardstock/shardstock/internal/stock"
)

// entryStripes is how many SKU stripes the entry gate has: entries of SKUs
// in different stripes go to the database at once.
const entryStripes = 64

// entryGate lets one RequestToken per SKU stripe enter its ticket at a
// time in this process. An entry holds its SKU's admission lock (a
// transaction, one pool connection) and may read the SKU's stock on a
// second connection under it (EnterTicket's free). A crowd whose entries
// all waited on that lock in Postgres would hold every connection of the
// pool, leaving none for the holder's read: the holder and its waiters
// then wait on each other until their timeouts (docs/admission.md).
// Waiting here takes no connection, and the lock sees at most one entry of
// a SKU per process.
type entryGate struct {
	stripes [entryStripes]chan struct{}
}

func newEntryGate() *entryGate {
	g := &entryGate{}
	for i := range g.stripes {
		g.stripes[i] = make(chan struct{}, 1)
	}
	return g
}

// enter waits for sku's stripe, or for ctx; leave must be called once the
// entry's transaction has ended.
func (g *entryGate) enter(ctx context.Context, sku string) (leave func(), err error) {
	h := fnv.New32a()
	h.Write([]byte(sku))
	stripe := g.stripes[h.Sum32()%entryStripes]
	select {
	case stripe <- struct{}{}:
		return func() { <-stripe }, nil
	case <-ctx.Done():
		return nil, stock.Errorf(stock.CodeShardUnavailable, "the request ended waiting for the sku's waitlist; retry with the same key")
	}
}
