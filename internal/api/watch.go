package api

import (
	"context"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// The change stream's handlers: each converts the request, runs one of
// ledger.Stream's watches and converts what it sends.

// noStream is the answer of a server without a change stream (the load
// generator's targets).
var noStream = wire.ToConnect(stock.Errorf(stock.CodeUnimplemented, "this server has no change stream"))

// WatchSendMaxDefault bounds how long one message of a watch may wait for
// its consumer to take it (WatchWriter): a consumer that stops reading
// without closing (its HTTP/2 window full) blocks a send for good, and
// holds its goroutine and its buffer of the shared read until its stream is
// reset. A consumer that reads at all takes a message within milliseconds;
// a slow one is ended sooner by the stream's own bounds (docs/changestream.md).
const WatchSendMaxDefault = 30 * time.Second

// watchWriterKey is the context key of a watch's writer.
type watchWriterKey struct{}

// watchWriter is what WatchWriter gives a watch: the response controller
// of its stream and the writer Connect writes its messages to.
type watchWriter struct {
	rc *http.ResponseController
	w  *burstWriter
}

// burstWriter is a watch's response as Connect sees it. Connect flushes
// after every message of a stream: one HTTP/2 frame and one write to the
// socket per ledger entry, for the server and the consumer alike. While
// held, a Flush does nothing: the messages of a burst (a page of the
// ledger) go out in the frames they fill, and the burst's last message,
// sent unheld, flushes them all. Only the handler's goroutine (Connect's
// Send) uses it.
type burstWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController // of ResponseWriter
	held bool
}

// Flush flushes the response unless held.
func (w *burstWriter) Flush() {
	if !w.held {
		_ = w.rc.Flush()
	}
}

// Unwrap is the response under w, for http.ResponseController.
func (w *burstWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WatchWriter lets the watches of h end their own stream: a send that
// waits longer than the handler's WatchSendMax sets the stream's write
// deadline in the past, which resets the stream and returns the send. It
// also lets a watch send a burst of messages in one flush (burstWriter).
// Connect hands a handler no ResponseWriter, so both travel in the
// request's context.
func WatchWriter(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		ww := watchWriter{rc: rc, w: &burstWriter{ResponseWriter: w, rc: rc}}
		ctx := context.WithValue(r.Context(), watchWriterKey{}, ww)
		h.ServeHTTP(ww.w, r.WithContext(ctx))
	})
}

// holdFlushes returns what holds (true) or releases (false) the flushes of
// ctx's watch (see burstWriter); without WatchWriter, it does nothing.
func holdFlushes(ctx context.Context) func(bool) {
	ww, _ := ctx.Value(watchWriterKey{}).(watchWriter)
	if ww.w == nil {
		return func(bool) {}
	}
	return func(held bool) { ww.w.held = held }
}

// sendGuard bounds each send of one watch to max (see WatchWriter); a nil
// guard bounds nothing (no WatchWriter).
type sendGuard struct {
	max   time.Duration
	timer *time.Timer
	mu    sync.Mutex // the timer's function and close: never the controller after the handler ends
	done  bool
	fired bool
}

// guardSends returns the guard of ctx's watch, and what stops it before
// the handler returns.
func guardSends(ctx context.Context, max time.Duration) (*sendGuard, func()) {
	ww, _ := ctx.Value(watchWriterKey{}).(watchWriter)
	rc := ww.rc
	if rc == nil {
		return nil, func() {}
	}
	if max <= 0 {
		max = WatchSendMaxDefault
	}
	g := &sendGuard{max: max}
	g.timer = time.AfterFunc(time.Hour, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.done {
			g.fired = true
			_ = rc.SetWriteDeadline(time.Unix(1, 0))
		}
	})
	g.timer.Stop()
	return g, func() {
		g.timer.Stop()
		g.mu.Lock()
		g.done = true
		g.mu.Unlock()
	}
}

// send runs one send within the guard's bound: CONSUMER_BEHIND if the
// bound ended it.
func (g *sendGuard) send(f func() error) error {
	if g == nil {
		return f()
	}
	g.timer.Reset(g.max)
	err := f()
	g.timer.Stop()
	g.mu.Lock()
	fired := g.fired
	g.mu.Unlock()
	if fired {
		return stock.Errorf(stock.CodeConsumerBehind, "this consumer took no message for %s: its stream was reset; resume from its last cursor", g.max)
	}
	return err
}

// WatchLedger streams the ledger after a cursor.
func (h *AdminHandler) WatchLedger(ctx context.Context, req *connect.Request[v1.WatchLedgerRequest], out *connect.ServerStream[v1.WatchLedgerResponse]) error {
	if h.Changes == nil {
		return noStream
	}
	m := req.Msg
	cur, err := ledger.ParseCursor(m.GetCursor())
	if err != nil {
		return wire.ToConnect(err)
	}
	guard, stop := guardSends(ctx, h.WatchSendMax)
	defer stop()
	hold := holdFlushes(ctx)
	err = h.Changes.WatchLedger(ctx, ledger.Watch{Cursor: cur, SKUs: m.GetSkus(), Consumer: m.GetConsumer(), FromNow: m.GetFromNow()}, func(d ledger.Delivery) error {
		msg := &v1.WatchLedgerResponse{Database: d.Database, Cursor: d.Cursor}
		if d.Entry != nil {
			msg.Entry = wire.LedgerEntryToProto(d.Entry)
		}
		hold(d.More)
		return guard.send(func() error { return out.Send(msg) })
	})
	hold(false)
	return streamEnd(ctx, err)
}

// stockEvents maps the stream's events to the API's.
var stockEvents = map[ledger.StockEvent]v1.StockEvent{
	ledger.StockSnapshot:    v1.StockEvent_STOCK_EVENT_SNAPSHOT,
	ledger.StockChanged:     v1.StockEvent_STOCK_EVENT_CHANGED,
	ledger.StockSoldOut:     v1.StockEvent_STOCK_EVENT_SOLD_OUT,
	ledger.StockBackInStock: v1.StockEvent_STOCK_EVENT_BACK_IN_STOCK,
}

// WatchStock streams SKUs' stock as it changes.
func (h *InventoryHandler) WatchStock(ctx context.Context, req *connect.Request[v1.WatchStockRequest], out *connect.ServerStream[v1.WatchStockResponse]) error {
	if h.Changes == nil {
		return noStream
	}
	guard, stop := guardSends(ctx, h.WatchSendMax)
	defer stop()
	err := h.Changes.WatchStock(ctx, req.Msg.GetSkus(), h.Inventory.GetStock, func(c ledger.StockChange) error {
		msg := &v1.WatchStockResponse{Stock: StockToProto(c.Stock), Event: stockEvents[c.Event]}
		return guard.send(func() error { return out.Send(msg) })
	})
	return streamEnd(ctx, err)
}

// streamEnd is a watch's error on the wire: nil once the client has gone
// (or the server is stopping), the domain's code otherwise.
func streamEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return wire.ToConnect(err)
}
