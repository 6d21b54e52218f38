package ledger

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// A tail is one database's ledger read once for every watch of a process:
// one goroutine reads what follows its position every poll interval and
// hands each page to every subscriber through a bounded buffer of the
// subscriber's own. It never waits for a subscriber: one whose buffer is
// full is dropped (CONSUMER_BEHIND) and resumes from its cursor, so a slow
// or stuck consumer can slow neither the reader nor the writers, and N
// watches cost Postgres what one does. A watch that starts behind the tail
// (an older cursor) reads on its own until it reaches the tail's position,
// then joins it (Stream.WatchLedger).
//
// The tail runs while it has subscribers: the first join starts it at the
// database's head, and it ends after a read that finds none left, or on a
// read error, which ends every subscriber (SHARD_UNAVAILABLE); the next
// join starts it again.
type tail struct {
	stream *Stream
	name   string
	r      Reader

	mu      sync.Mutex
	running bool
	pos     Position // the last position read: a subscriber gets what follows it
	subs    map[*subscriber]struct{}
}

// subscriberPagesMax bounds the pages a tail holds for one subscriber that
// has not taken them yet: with watchPageMax entries a page at most, the
// memory a consumer that stops reading can hold. At the poll interval a
// busy database fills a page or less a read, so it is several seconds of
// a consumer's lag at the peak before it is dropped.
const subscriberPagesMax = 64

// tailPage is a page of one database's tail.
type tailPage struct {
	db      string
	changes []Change
}

// subscriber is one watch's place in the tails it joined.
type subscriber struct {
	pages   chan tailPage // bounded: subscriberPagesMax
	queued  atomic.Int64  // entries in pages
	dropped chan struct{} // closed when a tail dropped it; err says why
	once    sync.Once
	err     error
}

func newSubscriber() *subscriber {
	return &subscriber{pages: make(chan tailPage, subscriberPagesMax), dropped: make(chan struct{})}
}

// drop ends the subscriber with err (the first drop's error stands).
func (s *subscriber) drop(err error) {
	s.once.Do(func() { s.err = err; close(s.dropped) })
}

// join subscribes sub to the tail if from is at or past the tail's
// position (it then receives every page the tail reads after from; the
// entries of a page at or before from are its to skip), starting the tail
// if it is not running. It reports false if sub must first read up to the
// tail's position on its own. always: subscribe whatever from is (the
// watch starts at the tail's position: WatchStock).
func (t *tail) join(ctx context.Context, sub *subscriber, from Position, always bool) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		head, _, err := t.r.Head(ctx)
		t.stream.metrics.reads.WithLabelValues("head").Inc()
		if err != nil {
			return false, unreadable(ctx, t.name, err)
		}
		t.pos, t.running, t.subs = head, true, map[*subscriber]struct{}{}
		go t.run()
	}
	if !always && from.Less(t.pos) {
		return false, nil
	}
	t.subs[sub] = struct{}{}
	return true, nil
}

// leave unsubscribes sub.
func (t *tail) leave(sub *subscriber) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.subs, sub)
}

// run reads the tail until it has no subscriber left or a read fails.
func (t *tail) run() {
	for {
		for {
			page, err := t.r.Changes(context.Background(), t.position(), watchPageMax)
			t.stream.metrics.reads.WithLabelValues("tail").Inc()
			if err != nil {
				t.fail(err)
				return
			}
			if !t.publish(page) {
				return
			}
			if len(page) < watchPageMax {
				break
			}
		}
		time.Sleep(t.stream.poll)
	}
}

func (t *tail) position() Position {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pos
}

// publish hands page to every subscriber, dropping those whose buffer is
// full, and moves the tail past it. It reports false, and stops the tail,
// if no subscriber is left.
func (t *tail) publish(page []Change) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(page) > 0 {
		t.pos = page[len(page)-1].Pos
		for sub := range t.subs {
			sub.queued.Add(int64(len(page)))
			select {
			case sub.pages <- tailPage{db: t.name, changes: page}:
			default:
				sub.queued.Add(-int64(len(page)))
				delete(t.subs, sub)
				t.stream.metrics.dropped.Inc()
				sub.drop(stock.Errorf(stock.CodeConsumerBehind,
					"this consumer fell %d pages behind the ledger of database %q: resume from its last cursor", subscriberPagesMax, t.name))
			}
		}
	}
	if len(t.subs) == 0 {
		t.running = false
		return false
	}
	return true
}

// fail ends every subscriber with a read's error and stops the tail.
func (t *tail) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for sub := range t.subs {
		sub.drop(unreadable(context.Background(), t.name, err))
	}
	t.subs, t.running = nil, false
}
