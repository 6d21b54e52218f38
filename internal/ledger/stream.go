package ledger

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardstock/shardstock/internal/stock"
)

// Reader is one database's ledger read in commit order
// (internal/postgres.DB; docs/changestream.md says why it is correct).
type Reader interface {
	// Changes returns up to limit entries after pos, in Position order, of
	// transactions that had ended when the read began: every entry that
	// will ever come before the last one returned.
	Changes(ctx context.Context, after Position, limit int) ([]Change, error)
	// Head returns the position of the newest entry Changes may return now
	// (zero if none), and the next transaction id the database hands out:
	// no position of the database reaches it.
	Head(ctx context.Context) (head Position, next uint64, err error)
}

// Bounds of the change stream. A process reads each database once for all
// its watches (tail.go), a page at a time; a watch behind the tail reads on
// its own until it reaches it. These bound what a consumer costs its
// process; none can slow the reads or the writers.
const (
	// watchPageMax bounds the entries read at once from one database.
	watchPageMax = 256
	// PollIntervalDefault is how long a tail that has read everything
	// waits before it reads again: about half of it is the stream's lag
	// behind a commit when the database is idle otherwise.
	PollIntervalDefault = 100 * time.Millisecond
	// progressInterval: a watch whose filter skipped entries sends its
	// cursor alone at least this often, so that its consumer's saved
	// cursor follows; keepAliveInterval: a watch with nothing to send sends
	// its cursor this often, so that a consumer tells a quiet stream from a
	// dead one.
	progressInterval  = time.Second
	keepAliveInterval = 15 * time.Second
	// pageSendMax: a consumer that takes longer than this to receive one
	// page is too far behind to be streamed to: it is told to resume from
	// its cursor (CONSUMER_BEHIND), and its place is freed.
	pageSendMax = 10 * time.Second
	// watchersMax bounds the watches of one process (beyond: RATE_LIMITED).
	watchersMax = 1024
	// SKUsWatchedMax bounds the SKUs one watch names.
	SKUsWatchedMax = 100
	// ConsumerLenMax bounds a consumer's name (its metrics label).
	ConsumerLenMax = 64
	// stockIntervalMin bounds WatchStock's rate per SKU: at most one
	// message per SKU this often, the changes in between coalesced.
	stockIntervalMin = 200 * time.Millisecond
	// stockRecheckInterval: WatchStock reads every SKU it watches this
	// often whatever the ledger says, for what no entry records (a pause).
	stockRecheckInterval = 5 * time.Second
)

// StreamConfig configures a Stream.
type StreamConfig struct {
	// Readers are the databases, by name.
	Readers map[string]Reader
	// PollInterval: PollIntervalDefault if zero.
	PollInterval time.Duration
	// Registerer, if set, registers the stream's metrics.
	Registerer prometheus.Registerer
}

// Stream is the ledger as a change stream: every entry, in each database
// in commit order, at least once, resumable by Cursor.
type Stream struct {
	readers map[string]Reader
	names   []string
	poll    time.Duration
	tails   map[string]*tail
	slots   chan struct{}
	metrics streamMetrics
}

type streamMetrics struct {
	consumers  *prometheus.GaugeVec // by stream
	lagEntries *prometheus.GaugeVec // by consumer
	lagSeconds *prometheus.GaugeVec // by consumer
	delivered  *prometheus.CounterVec
	reads      *prometheus.CounterVec // by read
	dropped    prometheus.Counter

	deliveredLedger prometheus.Counter // delivered's ledger stream, looked up once
}

// NewStream returns a Stream over cfg's databases.
func NewStream(cfg StreamConfig) *Stream {
	s := &Stream{readers: cfg.Readers, poll: cfg.PollInterval, slots: make(chan struct{}, watchersMax), tails: map[string]*tail{}}
	if s.poll <= 0 {
		s.poll = PollIntervalDefault
	}
	for name, r := range cfg.Readers {
		s.names = append(s.names, name)
		s.tails[name] = &tail{stream: s, name: name, r: r}
	}
	sort.Strings(s.names)
	s.metrics = streamMetrics{
		consumers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardstock_watch_consumers",
			Help: "Watches connected, by stream (ledger: WatchLedger, stock: WatchStock)."}, []string{"stream"}),
		lagEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardstock_watch_lag_entries",
			Help: "Entries a WatchLedger consumer had yet to receive at its last read (at least; a page at most per database)."}, []string{"consumer"}),
		lagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardstock_watch_lag_seconds",
			Help: "Age of the oldest entry a WatchLedger consumer had yet to receive at its last read."}, []string{"consumer"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardstock_watch_entries_delivered_total",
			Help: "Ledger entries sent to WatchLedger consumers, and stock messages to WatchStock consumers, by stream."}, []string{"stream"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardstock_watch_reads_total",
			Help: "Reads of the ledger for the watches, by read (tail: one a poll interval per database, whatever the number of watches; catch_up: a watch behind the tail reading on its own; head: a tail starting)."}, []string{"read"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardstock_watch_consumers_dropped_total",
			Help: "Watches ended CONSUMER_BEHIND because they let their buffer of the tail fill up."}),
	}
	s.metrics.deliveredLedger = s.metrics.delivered.WithLabelValues("ledger")
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.metrics.consumers, s.metrics.lagEntries, s.metrics.lagSeconds, s.metrics.delivered, s.metrics.reads, s.metrics.dropped)
	}
	return s
}

// Watch is what a WatchLedger consumer asks for.
type Watch struct {
	// Cursor: where to start; empty, at the beginning of every database.
	Cursor Cursor
	// SKUs: only these SKUs' entries; none, every entry.
	SKUs []string
	// Consumer names the consumer in the lag metrics; "" is "anonymous".
	Consumer string
	// FromNow: start at each database's current end (its Head) instead of
	// Cursor, which must then be empty. The watch's first message is its
	// starting cursor alone, so that a consumer has a place to resume from
	// before any entry comes.
	FromNow bool
}

// Delivery is one message of WatchLedger.
type Delivery struct {
	// Database holds the entry.
	Database string
	// Entry: nil in a progress message, which carries the cursor alone.
	Entry *stock.LedgerEntry
	// Cursor is where to resume to receive what follows.
	Cursor string
	// More: the watch sends another message at once (the rest of a page
	// it holds), so a transport may hold this one back and send the burst
	// together after its last message, which has More false.
	More bool
}

// WatchLedger sends every ledger entry after w.Cursor that w selects, each
// with the cursor after it, until ctx ends, send fails or a database
// cannot be read (SHARD_UNAVAILABLE: resume from the last cursor). In each
// database it reads on its own up to the tail's position, then joins the
// tail (tail.go). A consumer that receives a page slower than pageSendMax,
// or that lets subscriberPagesMax pages of the tail pile up, is ended with
// CONSUMER_BEHIND. Bad input is INVALID_ARGUMENT before anything is read.
func (s *Stream) WatchLedger(ctx context.Context, w Watch, send func(Delivery) error) error {
	skus, err := checkSKUs(w.SKUs, false)
	if err != nil {
		return err
	}
	consumer, err := checkConsumer(w.Consumer)
	if err != nil {
		return err
	}
	release, err := s.join("ledger")
	if err != nil {
		return err
	}
	defer release()
	if w.FromNow && len(w.Cursor) > 0 {
		return stock.Errorf(stock.CodeInvalidArgument, "from now: a watch starts from a cursor or from now, not both")
	}
	cur := w.Cursor.clone()
	if cur == nil {
		cur = Cursor{}
	}
	if err := s.checkCursor(ctx, cur); err != nil {
		return err
	}
	if w.FromNow {
		if err := s.heads(ctx, cur); err != nil {
			return err
		}
	}
	defer s.metrics.lagEntries.DeleteLabelValues(consumer)
	defer s.metrics.lagSeconds.DeleteLabelValues(consumer)
	lw := &ledgerWatch{stream: s, skus: skus, consumer: consumer, send: send, cur: cur, sentCursor: cur.String(),
		lastSent: time.Now(), lag: make(map[string]lagAt, len(s.names))}
	sub := newSubscriber()
	defer func() {
		for _, name := range s.names {
			s.tails[name].leave(sub)
		}
	}()
	if w.FromNow {
		if err := send(Delivery{Cursor: lw.sentCursor}); err != nil {
			return err
		}
	}
	if err := lw.catchUp(ctx, sub); err != nil {
		return err
	}
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.dropped:
			return sub.err
		case p := <-sub.pages:
			queued := sub.queued.Add(-int64(len(p.changes)))
			lw.lag[p.db] = lagAt{entries: int(queued) + len(p.changes), oldest: p.changes[0].Entry.CreatedAt}
			s.setLag(consumer, lw.lag)
			if err := lw.deliver(p.db, p.changes); err != nil {
				return err
			}
			lw.lag[p.db] = lagAt{}
			s.setLag(consumer, lw.lag)
		case <-tick.C:
			if err := lw.progress(); err != nil {
				return err
			}
		}
	}
}

// ledgerWatch is one WatchLedger's state.
type ledgerWatch struct {
	stream     *Stream
	skus       map[string]bool
	consumer   string
	send       func(Delivery) error
	cur        Cursor
	sentCursor string
	lastSent   time.Time
	lag        map[string]lagAt
}

// catchUp reads each database on its own, a page at a time, from the
// watch's cursor until it is at or past the tail's position, and joins the
// tail there: from then on the tail's pages hold all that follows.
func (lw *ledgerWatch) catchUp(ctx context.Context, sub *subscriber) error {
	s := lw.stream
	caughtUp := make(map[string]bool, len(s.names)) // its last read was not a full page
	joined := make(map[string]bool, len(s.names))
	for len(joined) < len(s.names) {
		for _, name := range s.names {
			if joined[name] {
				continue
			}
			if caughtUp[name] {
				ok, err := s.tails[name].join(ctx, sub, lw.cur[name], false)
				if err != nil {
					return err
				}
				if ok {
					joined[name] = true
					continue
				}
			}
			page, err := s.readers[name].Changes(ctx, lw.cur[name], watchPageMax)
			s.metrics.reads.WithLabelValues("catch_up").Inc()
			if err != nil {
				return unreadable(ctx, name, err)
			}
			caughtUp[name] = len(page) < watchPageMax
			lw.lag[name] = lagOf(page)
			s.setLag(lw.consumer, lw.lag)
			if err := lw.deliver(name, page); err != nil {
				return err
			}
			lw.lag[name] = lagAt{}
			s.setLag(lw.consumer, lw.lag)
		}
		if err := lw.progress(); err != nil {
			return err
		}
	}
	return nil
}

// deliver sends the entries of a page of database name that follow the
// watch's cursor and that it selects, moving the cursor past each. Every
// message but the page's last says More.
func (lw *ledgerWatch) deliver(name string, page []Change) error {
	start := time.Now()
	// The page is in Position order and the cursor moves only to positions
	// in it, so what the cursor is now tells which entries will be sent.
	last := len(page) - 1
	for ; last >= 0 && !lw.sends(name, &page[last]); last-- {
	}
	sent := 0
	for i := range page {
		c := &page[i]
		if !lw.cur[name].Less(c.Pos) {
			continue // read before the watch joined the tail
		}
		lw.cur[name] = c.Pos
		if lw.skus != nil && !lw.skus[c.Entry.Shard.SKU] {
			continue
		}
		lw.sentCursor = lw.cur.String()
		if err := lw.send(Delivery{Database: name, Entry: &c.Entry, Cursor: lw.sentCursor, More: i < last}); err != nil {
			lw.stream.metrics.deliveredLedger.Add(float64(sent))
			return err
		}
		sent++
	}
	if sent > 0 {
		lw.stream.metrics.deliveredLedger.Add(float64(sent))
		lw.lastSent = time.Now()
	}
	if time.Since(start) > pageSendMax {
		return stock.Errorf(stock.CodeConsumerBehind, "this consumer took over %s to receive %d entries: resume from its last cursor", pageSendMax, len(page))
	}
	return nil
}

// sends says whether deliver sends c, of database name: it follows the
// cursor and the watch selects its SKU.
func (lw *ledgerWatch) sends(name string, c *Change) bool {
	return lw.cur[name].Less(c.Pos) && (lw.skus == nil || lw.skus[c.Entry.Shard.SKU])
}

// progress sends the cursor alone if the filter skipped entries since the
// last message, or all has been quiet for keepAliveInterval.
func (lw *ledgerWatch) progress() error {
	since := time.Since(lw.lastSent)
	if since < keepAliveInterval && (since < progressInterval || lw.cur.String() == lw.sentCursor) {
		return nil
	}
	lw.sentCursor = lw.cur.String()
	if err := lw.send(Delivery{Cursor: lw.sentCursor}); err != nil {
		return err
	}
	lw.lastSent = time.Now()
	return nil
}

// heads sets cur at every database's head: the newest entry that a read
// may return now, so that a watch from there receives every entry of the
// transactions that had not ended by then (the position a tail starts at,
// tail.join).
func (s *Stream) heads(ctx context.Context, cur Cursor) error {
	for _, name := range s.names {
		head, _, err := s.readers[name].Head(ctx)
		s.metrics.reads.WithLabelValues("head").Inc()
		if err != nil {
			return unreadable(ctx, name, err)
		}
		cur[name] = head
	}
	return nil
}

// checkCursor refuses a cursor that names a database this stream does not
// read, or a position no entry of that database can have.
func (s *Stream) checkCursor(ctx context.Context, cur Cursor) error {
	for name, p := range cur {
		r := s.readers[name]
		if r == nil {
			return badCursor("it names database %q, which this service does not have", name)
		}
		_, next, err := r.Head(ctx)
		if err != nil {
			return unreadable(ctx, name, err)
		}
		if p.XID >= next {
			return badCursor("it is ahead of database %q", name)
		}
	}
	return nil
}

// lagAt is how far a consumer was behind one database at its last read.
type lagAt struct {
	entries int
	oldest  time.Time
}

func lagOf(page []Change) lagAt {
	if len(page) == 0 {
		return lagAt{}
	}
	return lagAt{entries: len(page), oldest: page[0].Entry.CreatedAt}
}

// setLag publishes a consumer's lag: the entries it has yet to receive,
// summed over databases, and the age of the oldest.
func (s *Stream) setLag(consumer string, lag map[string]lagAt) {
	entries, seconds := 0, 0.0
	for _, l := range lag {
		entries += l.entries
		if !l.oldest.IsZero() {
			seconds = max(seconds, time.Since(l.oldest).Seconds())
		}
	}
	s.metrics.lagEntries.WithLabelValues(consumer).Set(float64(entries))
	s.metrics.lagSeconds.WithLabelValues(consumer).Set(seconds)
}

// join takes a watch's place in the process, if one is free.
func (s *Stream) join(stream string) (release func(), err error) {
	select {
	case s.slots <- struct{}{}:
	default:
		return nil, stock.Errorf(stock.CodeRateLimited, "this server is at its bound of %d watches; retry later", watchersMax)
	}
	g := s.metrics.consumers.WithLabelValues(stream)
	g.Inc()
	return func() { g.Dec(); <-s.slots }, nil
}

// checkSKUs validates the SKUs a watch names; need: at least one. It
// returns them as a set, nil for none.
func checkSKUs(skus []string, need bool) (map[string]bool, error) {
	if len(skus) > SKUsWatchedMax || need && len(skus) == 0 {
		return nil, stock.Errorf(stock.CodeInvalidArgument, "skus: want %d..%d, got %d", map[bool]int{true: 1}[need], SKUsWatchedMax, len(skus))
	}
	if len(skus) == 0 {
		return nil, nil
	}
	set := make(map[string]bool, len(skus))
	for _, sku := range skus {
		if err := stock.ValidateSKU(sku); err != nil {
			return nil, err
		}
		set[sku] = true
	}
	return set, nil
}

// checkConsumer validates a consumer's name: what ValidateSKU allows, up
// to ConsumerLenMax; "" is "anonymous".
func checkConsumer(name string) (string, error) {
	if name == "" {
		return "anonymous", nil
	}
	if len(name) > ConsumerLenMax || stock.ValidateSKU(name) != nil {
		return "", stock.Errorf(stock.CodeInvalidArgument, "consumer: want 1..%d of a-z, A-Z, 0-9, '-', '_', '.', ':'", ConsumerLenMax)
	}
	return name, nil
}

// unreadable is the error of a database that could not be read: ctx's
// own if it ended, else SHARD_UNAVAILABLE (the consumer resumes from its
// cursor), never the database's words.
func unreadable(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var se *stock.Error
	if errors.As(err, &se) {
		return err
	}
	return stock.Errorf(stock.CodeShardUnavailable, "the ledger of database %q cannot be read now: resume from the last cursor", name)
}

// StockEvent is what a WatchStock message says happened to a SKU.
type StockEvent string

const (
	// StockSnapshot is a SKU's first message: its stock when the watch began.
	StockSnapshot StockEvent = "snapshot"
	// StockChanged: the SKU's stock or status changed, and it is neither
	// of the below.
	StockChanged StockEvent = "changed"
	// StockSoldOut: nothing sellable is left (available and in transit 0).
	StockSoldOut StockEvent = "sold_out"
	// StockBackInStock: a sold-out SKU has sellable stock again.
	StockBackInStock StockEvent = "back_in_stock"
)

// Sellable is what a SKU can still sell: available on its shards plus
// what is in transit between them (the allocator counts both before
// OUT_OF_STOCK).
func Sellable(st *stock.Stock) int64 { return st.Total.Available + st.InTransit }

// EventOf says what a SKU's new stock is against the last one sent (nil:
// none sent yet), and whether it is worth a message.
func EventOf(last, now *stock.Stock) (StockEvent, bool) {
	switch {
	case last == nil:
		return StockSnapshot, true
	case Sellable(last) > 0 && Sellable(now) == 0:
		return StockSoldOut, true
	case Sellable(last) == 0 && Sellable(now) > 0:
		return StockBackInStock, true
	case last.Total != now.Total || last.InTransit != now.InTransit || last.SKU.Status != now.SKU.Status:
		return StockChanged, true
	}
	return "", false
}

// StockChange is one WatchStock message.
type StockChange struct {
	Stock *stock.Stock
	Event StockEvent
}

// WatchStock sends the stock of skus as it changes: each SKU's stock first
// (StockSnapshot), then, after ledger entries of the SKU, its stock read
// again, at most once per stockIntervalMin per SKU (what changed meanwhile
// is coalesced into one message), with StockSoldOut and StockBackInStock
// as it crosses zero. stockOf reads a SKU's stock. It ends as
// WatchLedger does.
func (s *Stream) WatchStock(ctx context.Context, skus []string, stockOf func(context.Context, string) (*stock.Stock, error), send func(StockChange) error) error {
	set, err := checkSKUs(skus, true)
	if err != nil {
		return err
	}
	release, err := s.join("stock")
	if err != nil {
		return err
	}
	defer release()
	// Join every database's tail where it is: the stock read below is at
	// least as new, and any entry after it leads to a read again.
	sub := newSubscriber()
	defer func() {
		for _, name := range s.names {
			s.tails[name].leave(sub)
		}
	}()
	for _, name := range s.names {
		if _, err := s.tails[name].join(ctx, sub, Position{}, true); err != nil {
			return err
		}
	}
	w := &stockWatch{stream: s, stockOf: stockOf, send: send, last: map[string]*stock.Stock{}, sentAt: map[string]time.Time{},
		dirty: map[string]bool{}}
	names := slices.Sorted(maps.Keys(set))
	for _, sku := range names {
		w.dirty[sku] = true
	}
	recheck := time.Now()
	tick := time.NewTicker(s.poll)
	defer tick.Stop()
	for {
		if time.Since(recheck) >= stockRecheckInterval {
			recheck = time.Now()
			for _, sku := range names {
				w.dirty[sku] = true
			}
		}
		if err := w.flush(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.dropped:
			return sub.err
		case p := <-sub.pages:
			sub.queued.Add(-int64(len(p.changes)))
			for _, c := range p.changes {
				if set[c.Entry.Shard.SKU] {
					w.dirty[c.Entry.Shard.SKU] = true
				}
			}
		case <-tick.C:
		}
	}
}

// stockWatch is one WatchStock's state: the last stock sent of each SKU,
// when, and the SKUs to read again.
type stockWatch struct {
	stream  *Stream
	stockOf func(context.Context, string) (*stock.Stock, error)
	send    func(StockChange) error
	last    map[string]*stock.Stock
	sentAt  map[string]time.Time
	dirty   map[string]bool
}

// flush reads again each dirty SKU whose last message is older than
// stockIntervalMin and sends what changed; the others stay dirty.
func (w *stockWatch) flush(ctx context.Context) error {
	for sku := range w.dirty {
		if time.Since(w.sentAt[sku]) < stockIntervalMin {
			continue
		}
		delete(w.dirty, sku)
		st, err := w.stockOf(ctx, sku)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		ev, ok := EventOf(w.last[sku], st)
		if !ok {
			continue
		}
		if err := w.send(StockChange{Stock: st, Event: ev}); err != nil {
			return err
		}
		w.stream.metrics.delivered.WithLabelValues("stock").Inc()
		w.last[sku], w.sentAt[sku] = st, time.Now()
	}
	return nil
}
