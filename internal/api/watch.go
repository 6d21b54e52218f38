package api

import (
	"context"

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
	err = h.Changes.WatchLedger(ctx, ledger.Watch{Cursor: cur, SKUs: m.GetSkus(), Consumer: m.GetConsumer()}, func(d ledger.Delivery) error {
		msg := &v1.WatchLedgerResponse{Database: d.Database, Cursor: d.Cursor}
		if d.Entry != nil {
			msg.Entry = wire.LedgerEntryToProto(d.Entry)
		}
		return out.Send(msg)
	})
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
	err := h.Changes.WatchStock(ctx, req.Msg.GetSkus(), h.Inventory.GetStock, func(c ledger.StockChange) error {
		return out.Send(&v1.WatchStockResponse{Stock: StockToProto(c.Stock), Event: stockEvents[c.Event]})
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
