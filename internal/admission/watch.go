package admission

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/shardstock/shardstock/internal/stock"
)

// WatchTicket's bounds. watchInterval is how often the watched tickets are
// looked at: a position a browser shows need not move faster. One look
// serves every stream of the process (watches), and a look that took long
// waits watchReadShare times its time before the next, at most
// watchIntervalMax, so that the looks take about a tenth of a connection
// however long the waitlist (its time includes a wait for a connection:
// a busy pool spaces the looks out too).
// watchReadMax bounds the tickets one statement reads. watchLenMax bounds a
// stream's life; the client watches again.
const (
	watchInterval    = 250 * time.Millisecond
	watchReadShare   = 10
	watchIntervalMax = 2 * time.Second
	watchReadMax     = 10_000
	watchLenMax      = 10 * time.Minute
)

// WatchTicket sends the ticket, then each change of its state or position,
// until it is no longer open (the outcome is the last message) or ctx ends.
func (s *Service) WatchTicket(ctx context.Context, id string, send func(*stock.Ticket) error) error {
	if err := validTicketID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, watchLenMax)
	defer cancel()
	last, err := s.store.GetTicket(ctx, id)
	if err != nil {
		return unavailable(err)
	}
	if err := send(last); err != nil || !open(last.State) {
		return err
	}
	w := s.watches.join(id)
	defer s.watches.leave(w)
	for open(last.State) {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil
			}
			return ctx.Err()
		case u := <-w.updates:
			if u.err != nil {
				return unavailable(u.err)
			}
			if u.t.State != last.State || u.t.Position != last.Position {
				if err := send(u.t); err != nil {
					return err
				}
				last = u.t
			}
		}
	}
	return nil
}

// open reports whether a ticket in state may still change.
func open(state stock.TicketState) bool {
	return state == stock.TicketWaiting || state == stock.TicketPending || state == stock.TicketRegistered
}

// watches looks at every watched ticket of this process at once, a
// watchInterval apart, while any stream watches: one read of the tickets
// and, per SKU, of the keys queued before them (Store.GetTickets). A
// stream that looked at its own ticket counted the tickets before it at
// every look: a crowd of W watchers on a waitlist of N cost W x N index
// entries four times a second (5,000 on 5,000: about 10 s of Postgres a
// second), where one look costs W + N.
type watches struct {
	store Store

	mu      sync.Mutex
	subs    map[*watch]struct{}
	running bool // a look loop runs (it ends when subs is empty)
}

// watch is one stream's place among the watches.
type watch struct {
	id string
	// updates holds the newest look at the ticket (capacity 1): a stream
	// behind on its sends skips the looks it missed.
	updates chan watchUpdate
}

type watchUpdate struct {
	t   *stock.Ticket
	err error
}

func (ws *watches) join(id string) *watch {
	w := &watch{id: id, updates: make(chan watchUpdate, 1)}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.subs == nil {
		ws.subs = map[*watch]struct{}{}
	}
	ws.subs[w] = struct{}{}
	if !ws.running {
		ws.running = true
		go ws.run()
	}
	return w
}

func (ws *watches) leave(w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.subs, w)
}

// run looks at the watched tickets until none is watched.
func (ws *watches) run() {
	wait := watchInterval
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		<-timer.C
		ws.mu.Lock()
		if len(ws.subs) == 0 {
			ws.running = false
			ws.mu.Unlock()
			return
		}
		subs := make([]*watch, 0, len(ws.subs))
		var ids []string
		seen := map[string]bool{}
		for w := range ws.subs {
			subs = append(subs, w)
			if !seen[w.id] {
				seen[w.id] = true
				ids = append(ids, w.id)
			}
		}
		ws.mu.Unlock()
		start := time.Now()
		byID, err := ws.look(ids)
		wait = min(max(watchInterval, watchReadShare*time.Since(start)), watchIntervalMax)
		for _, w := range subs {
			switch t := byID[w.id]; {
			case err != nil:
				w.offer(watchUpdate{err: err})
			case t == nil:
				w.offer(watchUpdate{err: stock.Errorf(stock.CodeTicketNotFound, "no such ticket")})
			default:
				w.offer(watchUpdate{t: t})
			}
		}
		timer.Reset(wait)
	}
}

// look reads the tickets ids, watchReadMax a statement.
func (ws *watches) look(ids []string) (map[string]*stock.Ticket, error) {
	byID := make(map[string]*stock.Ticket, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), watchReadMax)
		ctx, cancel := context.WithTimeout(context.Background(), batchWaitMax)
		got, err := ws.store.GetTickets(ctx, ids[:n])
		cancel()
		if err != nil {
			return nil, err
		}
		for _, t := range got {
			byID[t.ID] = t
		}
		ids = ids[n:]
	}
	return byID, nil
}

// offer replaces what the stream has not taken yet with u. Only the look
// loop sends, so the send cannot block.
func (w *watch) offer(u watchUpdate) {
	select {
	case <-w.updates:
	default:
	}
	w.updates <- u
}
