package baseline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/shardstock/shardstock/bench/internal/loadgen/memory"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/api"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

// RedisAPI is the Connect-fronted Redis: shardstock's public and admin API,
// through the same handlers (internal/api) and the same validation, over one
// Redis Lua script per request that checks the idempotency key, checks and
// moves the stock, and appends a ledger entry with the counts before and
// after, in one atomic step. With the append-only file on and appendfsync
// always (RedisAPIConfig.Fsync), every answer is on disk first. It is what a
// team would deploy instead of shardstock, and the load generator's
// redis-api target (a process of its own) measures it.
//
// Each SKU is one set of counters (no shards); its ledger is a stream
// whose entry ids are 0-1, 0-2, ...: ListLedger pages by them. The calls a
// sale does not need (adjustments, SKU updates, rebalancing) answer
// unimplemented, as the in-memory ceiling's do.
type RedisAPI struct {
	*memory.Server // the calls that answer unimplemented, and topology
	rdb            *redis.Client
	prefix         string
	auth           *auth.Authenticator // nil: no front
}

// RedisAPIConfig configures a RedisAPI.
type RedisAPIConfig struct {
	Addr     string // default 127.0.0.1:6379
	PoolSize int    // default 128
	Prefix   string // of every key; default "redisapi:"
	// AdminToken and ServiceToken, when set, put the allocator's front
	// before the handlers (Handler): the same API asks the same of its
	// callers.
	AdminToken, ServiceToken string
}

var _ api.Admin = (*RedisAPI)(nil)

// NewRedisAPI connects to Redis and loads the scripts.
func NewRedisAPI(ctx context.Context, cfg RedisAPIConfig) (*RedisAPI, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:6379"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = redisPoolDefault
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "redisapi:"
	}
	s := &RedisAPI{Server: memory.New(), rdb: redis.NewClient(&redis.Options{Addr: cfg.Addr, PoolSize: cfg.PoolSize}), prefix: cfg.Prefix}
	if cfg.AdminToken != "" || cfg.ServiceToken != "" {
		a, err := auth.New(ctx, auth.Config{AdminTokens: []string{cfg.AdminToken}, ServiceTokens: []string{cfg.ServiceToken}})
		if err != nil {
			s.rdb.Close()
			return nil, fmt.Errorf("redis-api: %w", err)
		}
		s.auth = a
	}
	for _, sc := range []*redis.Script{apiTakeScript, apiEndScript} {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			s.rdb.Close()
			return nil, fmt.Errorf("redis-api: load script: %w", err)
		}
	}
	return s, nil
}

// Close closes the client.
func (s *RedisAPI) Close() error { return s.rdb.Close() }

// Handler serves the InventoryService and AdminService over it, with the
// options and handlers shardstock's allocators use. With tokens
// (RedisAPIConfig), also behind the allocator's front, the same code
// (api.InventoryFront): admission (the caller authenticated and its role
// checked, the bound on requests in flight at the allocator's default, the
// message read ahead), the call metrics, and the inventory's calls on kept
// goroutines (transport.Warm). Without the
// front, the API takes anonymous calls that shardstock refuses, and its
// CPU per request lacks what checking the caller and counting the call
// cost.
func (s *RedisAPI) Handler() http.Handler {
	mux := transport.NewMux(transport.MuxConfig{Services: []string{shardstockv1connect.InventoryServiceName, shardstockv1connect.AdminServiceName}})
	if s.auth == nil {
		mux.Handle(shardstockv1connect.NewInventoryServiceHandler(&api.InventoryHandler{Inventory: s}, transport.PublicHandlerOptions()...))
		mux.Handle(shardstockv1connect.NewAdminServiceHandler(&api.AdminHandler{Admin: s}, transport.PublicHandlerOptions()...))
		return mux
	}
	metrics := transport.NewMetrics(prometheus.NewRegistry())
	policy, _ := api.NewPolicy(nil) // no calls opted in: cannot fail
	admit := api.AdmitConfig{Auth: s.auth, Need: policy.Need, InFlight: api.InFlightDefault}
	invPath, inv, _ := api.InventoryFront(&api.InventoryHandler{Inventory: s}, admit, metrics)
	mux.Handle(invPath, inv)
	admit.InFlight = 0
	adminPath, admin := shardstockv1connect.NewAdminServiceHandler(&api.AdminHandler{Admin: s},
		append(transport.PublicHandlerOptions(), connect.WithInterceptors(metrics))...)
	mux.Handle(adminPath, api.Admit(admit, admin, metrics.Refused))
	return mux
}

func (s *RedisAPI) k(sku, what string) string { return s.prefix + "{" + sku + "}:" + what }

// apiTakeScript reserves or deducts. KEYS: counters (hash: a, r, s,
// opening, ttl), idempotency record, ledger stream, ledger sequence,
// reservation. ARGV: kind, quantity, sku, key, reservation id, order ref,
// now (ms), expiry (ms). Answers {status, detail, ledger id}.
var apiTakeScript = redis.NewScript(`
local prev = redis.call('GET', KEYS[2])
if prev then return {'replayed', prev} end
local c = redis.call('HMGET', KEYS[1], 'a', 'r', 's')
if not c[1] then return {'error', 'SKU_NOT_FOUND'} end
local a, r, s = tonumber(c[1]), tonumber(c[2]), tonumber(c[3])
local q = tonumber(ARGV[2])
if a < q then return {'oos', tostring(a)} end
local na, nr, ns = a - q, r, s
if ARGV[1] == 'reserve' then
  nr = r + q
  redis.call('HSET', KEYS[5], 'sku', ARGV[3], 'qty', q, 'state', 'held', 'key', ARGV[4], 'exp', ARGV[8])
else
  ns = s + q
end
redis.call('HSET', KEYS[1], 'a', na, 'r', nr, 's', ns)
local id = redis.call('INCR', KEYS[4])
local record = ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[5] .. ':' .. ARGV[7]
redis.call('SET', KEYS[2], record)
redis.call('XADD', KEYS[3], '0-' .. id, 'kind', ARGV[1], 'qty', q, 'key', ARGV[4], 'res', ARGV[5], 'ref', ARGV[6],
  'ab', a, 'rb', r, 'sb', s, 'aa', na, 'ra', nr, 'sa', ns, 'at', ARGV[7])
return {'ok', record}
`)

// apiEndScript commits or releases. KEYS: counters, reservation, ledger
// stream, ledger sequence. ARGV: target state, kind, reservation id, now
// (ms). Answers {status, detail}.
var apiEndScript = redis.NewScript(`
local h = redis.call('HMGET', KEYS[2], 'state', 'qty', 'key', 'exp')
if not h[1] then return {'error', 'RESERVATION_NOT_FOUND'} end
if h[1] == ARGV[1] then return {'replayed', h[2]} end
if h[1] == 'committed' then return {'error', 'RESERVATION_ALREADY_COMMITTED'} end
if h[1] == 'released' then return {'error', 'RESERVATION_ALREADY_RELEASED'} end
local q = tonumber(h[2])
local c = redis.call('HMGET', KEYS[1], 'a', 'r', 's')
local a, r, s = tonumber(c[1]), tonumber(c[2]), tonumber(c[3])
local na, nr, ns = a, r - q, s
if ARGV[2] == 'release' then na = a + q else ns = s + q end
redis.call('HSET', KEYS[2], 'state', ARGV[1])
redis.call('HSET', KEYS[1], 'a', na, 'r', nr, 's', ns)
local id = redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[3], '0-' .. id, 'kind', ARGV[2], 'qty', q, 'key', h[3], 'res', ARGV[3], 'ref', '',
  'ab', a, 'rb', r, 'sb', s, 'aa', na, 'ra', nr, 'sa', ns, 'at', ARGV[4])
return {'ok', h[2]}
`)

// CreateSKU writes the SKU's counters, validated as shardstock's are; one
// row whatever the shard count.
func (s *RedisAPI) CreateSKU(ctx context.Context, cfg stock.SKU, initial int64) (*stock.Stock, error) {
	if err := stock.PrepareNewSKU(&cfg, initial); err != nil {
		return nil, err
	}
	ok, err := s.rdb.HSetNX(ctx, s.k(cfg.Name, "c"), "opening", initial).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		return nil, stock.Errorf(stock.CodeSKUExists, "sku %q already exists", cfg.Name)
	}
	if err := s.rdb.HSet(ctx, s.k(cfg.Name, "c"), "a", initial, "r", 0, "s", 0, "ttl", cfg.ReservationTTL.Milliseconds(),
		"max", cfg.MaxPerOrder).Err(); err != nil {
		return nil, unavailable(err)
	}
	return s.GetStock(ctx, cfg.Name)
}

func unavailable(err error) *stock.Error {
	return stock.Errorf(stock.CodeShardUnavailable, "redis: %v", err)
}

// GetStock reads the SKU's counters.
func (s *RedisAPI) GetStock(ctx context.Context, name string) (*stock.Stock, error) {
	if err := stock.ValidateSKU(name); err != nil {
		return nil, err
	}
	v, err := s.rdb.HMGet(ctx, s.k(name, "c"), "a", "r", "s", "ttl", "max").Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if v[0] == nil {
		return nil, stock.Errorf(stock.CodeSKUNotFound, "no sku %q", name)
	}
	n := func(i int) int64 { x, _ := strconv.ParseInt(fmt.Sprint(v[i]), 10, 64); return x }
	c := stock.Counts{Available: n(0), Reserved: n(1), Sold: n(2)}
	cfg := &stock.SKU{Name: name, Status: stock.StatusActive, Shards: 1, ShardSpan: 1, ReservationTTL: time.Duration(n(3)) * time.Millisecond, MaxPerOrder: n(4)}
	return &stock.Stock{SKU: cfg, Total: c, Shards: []stock.ShardStock{{ServerID: "redis", Counts: c}}}, nil
}

// Allocate reserves or deducts, after the validation shardstock's
// allocators do.
func (s *RedisAPI) Allocate(ctx context.Context, r *stock.Request) stock.Result {
	r.Shard.Index = 0
	if err := stock.ValidateRequest(r); err != nil {
		return stock.ErrResult(err, nil)
	}
	sku := r.Shard.SKU
	now := time.Now()
	resID, exp := "", int64(0)
	if r.Kind == stock.OpReserve {
		resID = stock.NewReservationID(r.Shard)
		ttl := r.TTL
		if ttl == 0 {
			ttl = stock.ReservationTTLDefault
		}
		exp = now.Add(ttl).UnixMilli()
	}
	keys := []string{s.k(sku, "c"), s.k(sku, "k:"+r.Key), s.k(sku, "ledger"), s.k(sku, "seq"), s.k(sku, "h:"+resID)}
	v, err := apiTakeScript.Run(ctx, s.rdb, keys, string(r.Kind), r.Quantity, sku, r.Key, resID, r.OrderRef, now.UnixMilli(), exp).StringSlice()
	if err != nil {
		return stock.Result{Err: unavailable(err)}
	}
	switch {
	case len(v) != 2:
		return stock.Result{Err: stock.Errorf(stock.CodeInternal, "redis: answer %q", v)}
	case v[0] == "oos":
		return stock.Result{Err: stock.Errorf(stock.CodeOutOfStock, "sku %q has %s units", sku, v[1])}
	case v[0] == "error":
		return stock.Result{Err: stock.Errorf(stock.Code(v[1]), "sku %q", sku)}
	}
	// The record is kind:quantity:reservation id:time.
	parts := strings.SplitN(v[1], ":", 4)
	if len(parts) != 4 || parts[0] != string(r.Kind) || parts[1] != strconv.FormatInt(r.Quantity, 10) {
		return stock.Result{Err: stock.Errorf(stock.CodeIdempotencyKeyReused, "key %q was used for another request", r.Key)}
	}
	at, _ := strconv.ParseInt(parts[3], 10, 64)
	op := &stock.Operation{SKU: sku, IdempotencyKey: r.Key, Kind: r.Kind, Quantity: r.Quantity, Shard: 0, ReservationID: parts[2],
		OrderRef: r.OrderRef, CreatedAt: time.UnixMilli(at)}
	res := stock.Result{Operation: op, Replayed: v[0] == "replayed"}
	if r.Kind == stock.OpReserve {
		res.Reservation = &stock.Reservation{ID: parts[2], SKU: sku, Shard: 0, Quantity: r.Quantity, State: stock.ReservationHeld, IdempotencyKey: r.Key}
		if exp > 0 && !res.Replayed {
			res.Reservation.ExpiresAt = time.UnixMilli(exp)
		}
	}
	return res
}

// EndReservation commits or releases.
func (s *RedisAPI) EndReservation(ctx context.Context, r *stock.Request) stock.Result {
	k, err := stock.ParseReservationID(r.ReservationID)
	if err != nil {
		return stock.ErrResult(err, nil)
	}
	state := stock.ReservationCommitted
	if r.Kind == stock.OpRelease {
		state = stock.ReservationReleased
	}
	keys := []string{s.k(k.SKU, "c"), s.k(k.SKU, "h:"+r.ReservationID), s.k(k.SKU, "ledger"), s.k(k.SKU, "seq")}
	v, err := apiEndScript.Run(ctx, s.rdb, keys, string(state), string(r.Kind), r.ReservationID, time.Now().UnixMilli()).StringSlice()
	if err != nil {
		return stock.Result{Err: unavailable(err)}
	}
	if len(v) != 2 {
		return stock.Result{Err: stock.Errorf(stock.CodeInternal, "redis: answer %q", v)}
	}
	if v[0] == "error" {
		return stock.Result{Err: stock.Errorf(stock.Code(v[1]), "reservation %q", r.ReservationID)}
	}
	q, _ := strconv.ParseInt(v[1], 10, 64)
	return stock.Result{Replayed: v[0] == "replayed",
		Reservation: &stock.Reservation{ID: r.ReservationID, SKU: k.SKU, Shard: 0, Quantity: q, State: state}}
}

// GetOperation reads a key's record.
func (s *RedisAPI) GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if err := stock.ValidateKey(key); err != nil {
		return nil, err
	}
	v, err := s.rdb.Get(ctx, s.k(sku, "k:"+key)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, stock.Errorf(stock.CodeOperationNotFound, "no operation with key %q", key)
	}
	if err != nil {
		return nil, unavailable(err)
	}
	parts := strings.SplitN(v, ":", 4)
	if len(parts) != 4 {
		return nil, stock.Errorf(stock.CodeInternal, "redis: record %q", v)
	}
	q, _ := strconv.ParseInt(parts[1], 10, 64)
	at, _ := strconv.ParseInt(parts[3], 10, 64)
	return &stock.Operation{SKU: sku, IdempotencyKey: key, Kind: stock.OpKind(parts[0]), Quantity: q, ReservationID: parts[2], CreatedAt: time.UnixMilli(at)}, nil
}

// ListLedger returns up to limit entries with ids above after.
func (s *RedisAPI) ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	msgs, err := s.rdb.XRangeN(ctx, s.k(sku, "ledger"), "(0-"+strconv.FormatInt(after, 10), "+", int64(limit)).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	out := make([]*stock.LedgerEntry, 0, len(msgs))
	for _, m := range msgs {
		id, _ := strconv.ParseInt(strings.TrimPrefix(m.ID, "0-"), 10, 64)
		n := func(f string) int64 { x, _ := strconv.ParseInt(fmt.Sprint(m.Values[f]), 10, 64); return x }
		str := func(f string) string { x, _ := m.Values[f].(string); return x }
		out = append(out, &stock.LedgerEntry{ID: id, Shard: stock.ShardKey{SKU: sku}, Kind: stock.OpKind(str("kind")), Quantity: n("qty"),
			Before:         stock.Counts{Available: n("ab"), Reserved: n("rb"), Sold: n("sb")},
			After:          stock.Counts{Available: n("aa"), Reserved: n("ra"), Sold: n("sa")},
			IdempotencyKey: str("key"), ReservationID: str("res"), OrderRef: str("ref"), Source: stock.SourceAPI,
			ServerID: "redis", CreatedAt: time.UnixMilli(n("at"))})
	}
	return out, nil
}

// Reconcile checks the SKU's books with shardstock's own check: the ledger
// read back in full, against the counters.
func (s *RedisAPI) Reconcile(ctx context.Context, sku string) ([]ledger.Discrepancy, error) {
	st, err := s.GetStock(ctx, sku)
	if err != nil {
		return nil, err
	}
	opening, err := s.rdb.HGet(ctx, s.k(sku, "c"), "opening").Int64()
	if err != nil {
		return nil, unavailable(err)
	}
	var entries []*stock.LedgerEntry
	for after := int64(0); ; {
		page, err := s.ListLedger(ctx, sku, after, redisPageSize)
		if err != nil {
			return nil, err
		}
		entries = append(entries, page...)
		if len(page) < redisPageSize {
			break
		}
		after = page[len(page)-1].ID
	}
	keys, holds, err := s.records(ctx, sku)
	if err != nil {
		return nil, err
	}
	return ledger.Check(memory.Snapshot(sku, st.Total, opening, entries, keys, holds)), nil
}

// records reads the SKU's idempotency records (the keys of its operations)
// and its reservations.
func (s *RedisAPI) records(ctx context.Context, sku string) ([]string, map[string]*stock.Reservation, error) {
	var keys []string
	prefix := s.k(sku, "k:")
	iter := s.rdb.Scan(ctx, 0, prefix+"*", redisPageSize).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, strings.TrimPrefix(iter.Val(), prefix))
	}
	if err := iter.Err(); err != nil {
		return nil, nil, unavailable(err)
	}
	holds := map[string]*stock.Reservation{}
	prefix = s.k(sku, "h:")
	iter = s.rdb.Scan(ctx, 0, prefix+"*", redisPageSize).Iterator()
	for iter.Next(ctx) {
		v, err := s.rdb.HMGet(ctx, iter.Val(), "state", "qty").Result()
		if err != nil {
			return nil, nil, unavailable(err)
		}
		q, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
		holds[strings.TrimPrefix(iter.Val(), prefix)] = &stock.Reservation{State: stock.ReservationState(fmt.Sprint(v[0])), Quantity: q}
	}
	if err := iter.Err(); err != nil {
		return nil, nil, unavailable(err)
	}
	return keys, holds, nil
}
