package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of the batches in which RequestToken enters its tickets and marks
// them admitted.
const (
	// entryBatchLenMax bounds one batch of a SKU's entries: one
	// transaction, its insert one statement of that many rows (seven
	// arrays of parameters). Under a crowd a batch is what arrived while
	// the last one ran; past a few hundred, a larger batch saves nothing
	// more per request and only holds the SKU's lock longer.
	entryBatchLenMax = 256
	// markBatchLenMax bounds one batch of marks (one UPDATE), for the same
	// reason.
	markBatchLenMax = 256
	// batchQueueLenMax bounds the calls of one SKU (of the marks: of
	// every SKU) waiting for a batch in this process: 16 full batches. A
	// call beyond is answered SHARD_UNAVAILABLE (retry with the same key).
	batchQueueLenMax = 16 * entryBatchLenMax
	// batchWaitMax bounds a call's wait for its batch to be taken and
	// answered, whatever its context: a database that stopped answering
	// turns the queue into SHARD_UNAVAILABLE answers (retry with the same
	// key), not a pile of goroutines. It is the store's query timeout
	// (10 s), which bounds one batch, and a little more for the queue.
	batchWaitMax = 12 * time.Second
	// entryBatchesMax bounds the entry transactions of this process at
	// once (one per SKU at most, by the batches). Each holds its SKU's
	// lock and a pool connection, and reads the stock on a second
	// connection under it: with at most two at once, a pool of four
	// (pgxpool's least default) always has a connection for the holders'
	// reads, so no two holders wait on each other for one.
	entryBatchesMax = 2
)

// callState is where a call in a batch queue is.
const (
	callQueued int32 = iota
	callTaken
	callAbandoned
)

// call is one caller's item in a batch, and its answer once served.
type call[In, Out any] struct {
	in    In
	out   Out
	err   error
	state atomic.Int32
	done  chan struct{}
}

// batcher gathers concurrent calls of one key (a SKU, for entries) in this
// process into batches, smart batching as the shard writers do: no timer;
// the first call of an idle key is served at once, and the next batch is
// whatever queued while the last was served, up to lenMax. One batch of a
// key runs at a time, in the calls' order of arrival.
type batcher[In, Out any] struct {
	lenMax int
	// serve answers a batch: one Out per In, or an error for all of them.
	serve func(key string, ins []In) ([]Out, error)
	// slots, when set, bounds the batches of every key served at once.
	slots chan struct{}
	// queued, when set, is told of each call once it is queued.
	queued func(key string, in In)

	mu     sync.Mutex
	queues map[string][]*call[In, Out] // keys being served, and their calls waiting
}

func newBatcher[In, Out any](lenMax, parallelMax int, serve func(string, []In) ([]Out, error)) *batcher[In, Out] {
	b := &batcher[In, Out]{lenMax: lenMax, serve: serve, queues: map[string][]*call[In, Out]{}}
	if parallelMax > 0 {
		b.slots = make(chan struct{}, parallelMax)
	}
	return b
}

// do queues in under key and waits for its answer, for ctx, or for
// batchWaitMax. A call that ends before its batch is taken is left out of
// it; one that ends after may have been served (an entry recorded): its
// caller retries with the same key, and gets what was recorded.
func (b *batcher[In, Out]) do(ctx context.Context, key string, in In) (Out, error) {
	c := &call[In, Out]{in: in, done: make(chan struct{})}
	b.mu.Lock()
	q, running := b.queues[key]
	if len(q) >= batchQueueLenMax {
		b.mu.Unlock()
		var zero Out
		return zero, stock.Errorf(stock.CodeShardUnavailable, "too many requests wait for the sku's waitlist in this process; retry with the same key")
	}
	b.queues[key] = append(q, c)
	b.mu.Unlock()
	if b.queued != nil {
		b.queued(key, in)
	}
	if !running {
		go b.run(key)
	}
	timer := time.NewTimer(batchWaitMax)
	defer timer.Stop()
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
	case <-timer.C:
	}
	c.state.CompareAndSwap(callQueued, callAbandoned)
	var zero Out
	return zero, stock.Errorf(stock.CodeShardUnavailable, "the request ended waiting for the sku's waitlist; retry with the same key")
}

// run serves key's batches until its queue is empty.
func (b *batcher[In, Out]) run(key string) {
	for {
		b.mu.Lock()
		q := b.queues[key]
		var batch []*call[In, Out]
		n := 0
		for ; n < len(q) && len(batch) < b.lenMax; n++ {
			if q[n].state.CompareAndSwap(callQueued, callTaken) {
				batch = append(batch, q[n])
			}
		}
		if n == len(q) && len(batch) == 0 {
			delete(b.queues, key)
			b.mu.Unlock()
			return
		}
		b.queues[key] = q[n:]
		b.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		ins := make([]In, len(batch))
		for i, c := range batch {
			ins[i] = c.in
		}
		if b.slots != nil {
			b.slots <- struct{}{}
		}
		outs, err := b.serve(key, ins)
		if b.slots != nil {
			<-b.slots
		}
		for i, c := range batch {
			if err != nil {
				c.err = err
			} else {
				c.out = outs[i]
			}
			close(c.done)
		}
	}
}
