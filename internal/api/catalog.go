package api

import (
	"context"
	"encoding/base64"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// PrewarmSKUsMax bounds the SKUs of one Prewarm call: each costs a call to
// every one of its shards' servers.
const PrewarmSKUsMax = 100

// Catalog lists SKUs across databases (internal/dbset.Set).
type Catalog interface {
	ListSKUs(ctx context.Context, f stock.SKUFilter, after string, limit int) ([]stock.SKUSummary, error)
}

// Warmer does ahead of a sale what a SKU's first requests would do lazily
// (internal/allocator.Allocator).
type Warmer interface {
	// Prewarm returns the SKU's stock and how many of its shards' writers
	// run with their rows loaded.
	Prewarm(ctx context.Context, sku string) (*stock.Stock, int32, error)
}

// listSKUsTokenVersion is the first field of a ListSkus page token; a
// token of another version is refused, so the format may change.
const listSKUsTokenVersion = "1"

// listSKUsToken is a ListSkus page token: the version, the listing's
// filter and the last SKU of the page, opaque to clients. The filter is in
// it so that a token is refused on another listing, whose pages it would
// silently skip into.
func listSKUsToken(f stock.SKUFilter, last string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strings.Join([]string{listSKUsTokenVersion, f.Prefix, string(f.Status), last}, "\x00")))
}

// parseListSKUsToken returns the last SKU a token of listing f names ("" for
// no token), or INVALID_ARGUMENT for a token this API did not give for f.
func parseListSKUsToken(f stock.SKUFilter, tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	bad := stock.Errorf(stock.CodeInvalidArgument, "page_token is not one this API gave for this prefix and status")
	// Four fields of at most SKULenMax bytes each, and a few separators.
	if len(tok) > base64.RawURLEncoding.EncodedLen(4*(stock.SKULenMax+1)) {
		return "", bad
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", bad
	}
	parts := strings.Split(string(b), "\x00")
	if len(parts) != 4 || parts[0] != listSKUsTokenVersion || parts[1] != f.Prefix || parts[2] != string(f.Status) ||
		stock.ValidateSKU(parts[3]) != nil || !strings.HasPrefix(parts[3], f.Prefix) {
		return "", bad
	}
	return parts[3], nil
}

// skuFilterOf checks a listing's prefix and status.
func skuFilterOf(prefix string, status v1.SkuStatus) (stock.SKUFilter, error) {
	if prefix != "" {
		if err := stock.ValidateSKU(prefix); err != nil {
			return stock.SKUFilter{}, stock.Errorf(stock.CodeInvalidArgument, "prefix: %s", err.(*stock.Error).Message)
		}
	}
	f := stock.SKUFilter{Prefix: prefix}
	if status != v1.SkuStatus_SKU_STATUS_UNSPECIFIED {
		for s, p := range skuStatuses {
			if p == status {
				f.Status = s
			}
		}
		if f.Status == "" {
			return f, stock.Errorf(stock.CodeInvalidArgument, "status %d is not a SkuStatus; leave it unset for every status", int32(status))
		}
	}
	return f, nil
}

// ListSkus pages through every SKU of every database, by name.
func (h *AdminHandler) ListSkus(ctx context.Context, req *connect.Request[v1.ListSkusRequest]) (*connect.Response[v1.ListSkusResponse], error) {
	if h.Catalog == nil {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeUnimplemented, "this server lists no SKUs"))
	}
	m := req.Msg
	f, err := skuFilterOf(m.GetPrefix(), m.GetStatus())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	after, err := parseListSKUsToken(f, m.GetPageToken())
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	size := pageSize(m.GetPageSize())
	page, err := h.Catalog.ListSKUs(ctx, f, after, size)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	out := &v1.ListSkusResponse{}
	for _, s := range page {
		out.Skus = append(out.Skus, &v1.SkuSummary{Sku: skuToProto(s.SKU), Database: s.Database,
			Available: s.Total.Available, Reserved: s.Total.Reserved, Sold: s.Total.Sold, InTransit: s.InTransit})
	}
	if len(page) == size {
		out.NextPageToken = listSKUsToken(f, page[len(page)-1].SKU.Name)
	}
	return connect.NewResponse(out), nil
}

// Prewarm starts every shard writer of the SKUs named, with rows, hints
// and connections, before their first requests.
func (h *AdminHandler) Prewarm(ctx context.Context, req *connect.Request[v1.PrewarmRequest]) (*connect.Response[v1.PrewarmResponse], error) {
	if h.Warmer == nil {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeUnimplemented, "this server prewarms nothing"))
	}
	skus := req.Msg.GetSkus()
	if len(skus) == 0 || len(skus) > PrewarmSKUsMax {
		return nil, wire.ToConnect(stock.Errorf(stock.CodeInvalidArgument, "name 1 to %d skus", PrewarmSKUsMax))
	}
	for _, s := range skus {
		if err := stock.ValidateSKU(s); err != nil {
			return nil, wire.ToConnect(err)
		}
	}
	out := &v1.PrewarmResponse{}
	for _, s := range skus {
		st, warm, err := h.Warmer.Prewarm(ctx, s)
		if err != nil {
			return nil, wire.ToConnect(err)
		}
		out.Skus = append(out.Skus, &v1.PrewarmedSku{Sku: s, ShardsWarm: warm, Stock: StockToProto(st)})
	}
	return connect.NewResponse(out), nil
}

// validTimes refuses a sale window bound that is not a valid time.
func validTimes(ts ...*timestamppb.Timestamp) error {
	for _, t := range ts {
		if t != nil && (t.CheckValid() != nil || t.AsTime().Year() < 2000) {
			return stock.Errorf(stock.CodeInvalidArgument, "sale_start and sale_end must be times after the year 2000")
		}
	}
	return nil
}

// timeOf is a protobuf time as a domain time: zero when absent.
func timeOf(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

// timeOrNil is a protobuf time as an update's field: nil when absent.
func timeOrNil(t *timestamppb.Timestamp) *time.Time {
	if t == nil {
		return nil
	}
	at := t.AsTime()
	return &at
}

// protoTime is a domain time on the wire: absent when zero.
func protoTime(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
