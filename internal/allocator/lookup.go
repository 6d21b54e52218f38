package allocator

import (
	"context"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of the key lookups behind sold-out answers.
const (
	lookupsInFlightMax = 2
	lookupKeysMax      = 1024
	lookupQueueLenMax  = 8192
	lookupTimeout      = 3 * time.Second
)

// lookup is one key waiting to be looked up.
type lookup struct {
	key  string
	done chan lookupResult // buffered 1
}

type lookupResult struct {
	op  *stock.Operation
	err error
}

// lookups coalesces the "does this key have an operation?" reads that a
// sold-out answer needs into one query per batch of keys (smart batching:
// what queued while the last query ran), so that a sell-out storm costs a
// handful of queries a second, not one per request.
type lookups struct {
	a     *Allocator
	queue chan *lookup
	stop  chan struct{}
}

func newLookups(a *Allocator) *lookups {
	l := &lookups{a: a, queue: make(chan *lookup, lookupQueueLenMax), stop: make(chan struct{})}
	for range lookupsInFlightMax {
		go l.loop()
	}
	return l
}

// find returns the operation recorded for key, or nil.
func (l *lookups) find(ctx context.Context, key string) (*stock.Operation, error) {
	k := &lookup{key: key, done: make(chan lookupResult, 1)}
	select {
	case l.queue <- k:
	default:
		return nil, stock.Errorf(stock.CodeShardUnavailable, "too many lookups in flight; retry with the same key")
	}
	select {
	case r := <-k.done:
		return r.op, r.err
	case <-ctx.Done():
		return nil, stock.Errorf(stock.CodeShardUnavailable, "deadline passed during the key lookup; retry with the same key")
	}
}

func (l *lookups) close() { close(l.stop) }

func (l *lookups) loop() {
	for {
		var first *lookup
		select {
		case first = <-l.queue:
		case <-l.stop:
			return
		}
		batch := []*lookup{first}
	fill:
		for len(batch) < lookupKeysMax {
			select {
			case k := <-l.queue:
				batch = append(batch, k)
			default:
				break fill
			}
		}
		keys := make([]string, len(batch))
		for i, k := range batch {
			keys[i] = k.key
		}
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		ops, err := l.a.db.LookupOperations(ctx, keys)
		cancel()
		for _, k := range batch {
			if err != nil {
				k.done <- lookupResult{err: stock.Errorf(stock.CodeShardUnavailable, "could not check the key; retry with the same key")}
				continue
			}
			k.done <- lookupResult{op: ops[k.key]}
		}
	}
}
