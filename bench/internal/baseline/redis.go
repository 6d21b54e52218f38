package baseline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/stock"
)

// Limits of the Redis baseline.
const (
	redisPoolDefault = 128
	redisPageSize    = 5000 // keys per SCAN, entries per XRANGE
	redisPagesMax    = 100_000
	aofWaitMax       = 30 * time.Second
	aofPollInterval  = 50 * time.Millisecond
)

// RedisConfig configures the Redis baseline.
type RedisConfig struct {
	Addr     string // default 127.0.0.1:6379
	PoolSize int    // default 128
	// Fsync turns the append-only file on with appendfsync always for the
	// run (CONFIG SET), so that every acknowledged write is on disk, and puts
	// the server's settings back on Close.
	Fsync bool
}

// Redis is baseline (4): one Lua script per request that records the key
// with SET NX, checks the stock and DECRBYs it, and appends a ledger entry to
// a stream. Its keys share a prefix that Close deletes.
type Redis struct {
	cfg    RedisConfig
	rdb    *redis.Client
	prefix string
	saved  map[string]string // server settings to put back
}

var (
	_ loadgen.Target   = (*Redis)(nil)
	_ loadgen.Baseline = (*Redis)(nil)
)

// NewRedis returns baseline (4).
func NewRedis(cfg RedisConfig) *Redis {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:6379"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = redisPoolDefault
	}
	return &Redis{cfg: cfg}
}

// Name is redis, or redis-fsync with appendfsync always.
func (r *Redis) Name() string {
	if r.cfg.Fsync {
		return "redis-fsync"
	}
	return "redis"
}

// Baseline reports true.
func (r *Redis) Baseline() bool { return true }

func (r *Redis) key(parts ...string) string { return r.prefix + strings.Join(parts, "") }

// Prefix is the prefix of the run's keys (set by Setup), all of which Close
// deletes.
func (r *Redis) Prefix() string { return r.prefix }

func (r *Redis) available(sku string) string { return r.key("a:", sku) }
func (r *Redis) reserved(sku string) string  { return r.key("r:", sku) }
func (r *Redis) sold(sku string) string      { return r.key("s:", sku) }
func (r *Redis) initial(sku string) string   { return r.key("i:", sku) }
func (r *Redis) idem(sku, key string) string { return r.key("k:", sku, "|", key) }
func (r *Redis) hold(id string) string       { return r.key("h:", id) }
func (r *Redis) ledger() string              { return r.key("ledger") }

// takeScript deducts or reserves. KEYS: idempotency record, available,
// reserved or sold, ledger, reservation. ARGV: kind, quantity, sku, key,
// reservation id. A refusal deletes the record again, so the key stays free.
var takeScript = redis.NewScript(`
local record = ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[5]
if not redis.call('SET', KEYS[1], record, 'NX') then
  return {'replayed', redis.call('GET', KEYS[1])}
end
local available = redis.call('GET', KEYS[2])
if not available then
  redis.call('DEL', KEYS[1])
  return {'error', 'SKU_NOT_FOUND'}
end
local q = tonumber(ARGV[2])
if tonumber(available) < q then
  redis.call('DEL', KEYS[1])
  return {'oos', ''}
end
redis.call('DECRBY', KEYS[2], q)
redis.call('INCRBY', KEYS[3], q)
local dr, ds = 0, q
if ARGV[1] == 'reserve' then
  dr, ds = q, 0
  redis.call('HSET', KEYS[5], 'sku', ARGV[3], 'qty', q, 'state', 'held', 'key', ARGV[4])
end
redis.call('XADD', KEYS[4], '*', 'sku', ARGV[3], 'kind', ARGV[1], 'qty', q, 'key', ARGV[4], 'res', ARGV[5], 'da', -q, 'dr', dr, 'ds', ds)
return {'ok', record}
`)

// endScript commits or releases. KEYS: reservation, reserved, sold or
// available, ledger. ARGV: target state, kind, reservation id.
var endScript = redis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'state', 'qty', 'sku', 'key')
if not h[1] then return {'error', 'RESERVATION_NOT_FOUND'} end
if h[1] == ARGV[1] then return {'replayed', ''} end
if h[1] == 'committed' then return {'error', 'RESERVATION_ALREADY_COMMITTED'} end
if h[1] == 'released' then return {'error', 'RESERVATION_ALREADY_RELEASED'} end
local q = tonumber(h[2])
redis.call('HSET', KEYS[1], 'state', ARGV[1])
redis.call('DECRBY', KEYS[2], q)
redis.call('INCRBY', KEYS[3], q)
local da, ds = 0, q
if ARGV[2] == 'release' then da, ds = q, 0 end
redis.call('XADD', KEYS[4], '*', 'sku', h[3], 'kind', ARGV[2], 'qty', q, 'key', h[4], 'res', ARGV[3], 'da', da, 'dr', -q, 'ds', ds)
return {'ok', ''}
`)

// Setup connects, turns on fsync when asked, loads the scripts and writes
// the SKUs' counters.
func (r *Redis) Setup(ctx context.Context, skus []loadgen.SKUSpec) error {
	r.rdb = redis.NewClient(&redis.Options{Addr: r.cfg.Addr, PoolSize: r.cfg.PoolSize})
	r.prefix = "loadgen:" + r.Name() + ":" + randomHex(4) + ":"
	if r.cfg.Fsync {
		if err := r.enableFsync(ctx); err != nil {
			return err
		}
	}
	for _, s := range []*redis.Script{takeScript, endScript} {
		if err := s.Load(ctx, r.rdb).Err(); err != nil {
			return fmt.Errorf("baseline: redis: load script: %w", err)
		}
	}
	pipe := r.rdb.Pipeline()
	for i, s := range skus {
		pipe.Set(ctx, r.available(s.SKU), s.Stock, 0)
		pipe.Set(ctx, r.reserved(s.SKU), 0, 0)
		pipe.Set(ctx, r.sold(s.SKU), 0, 0)
		pipe.Set(ctx, r.initial(s.SKU), s.Stock, 0)
		if i%1000 == 999 || i == len(skus)-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("baseline: redis: create SKUs: %w", err)
			}
		}
	}
	return nil
}

// enableFsync saves appendonly and appendfsync, sets them to yes and always,
// and waits for the first rewrite of the append-only file to finish (until
// then Redis does not write commands to it).
func (r *Redis) enableFsync(ctx context.Context) error {
	r.saved = map[string]string{}
	for _, p := range []string{"appendonly", "appendfsync"} {
		m, err := r.rdb.ConfigGet(ctx, p).Result()
		if err != nil {
			return fmt.Errorf("baseline: redis: CONFIG GET %s: %w", p, err)
		}
		r.saved[p] = m[p]
	}
	for _, kv := range [][2]string{{"appendfsync", "always"}, {"appendonly", "yes"}} {
		if err := r.rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			return fmt.Errorf("baseline: redis: CONFIG SET %s %s: %w", kv[0], kv[1], err)
		}
	}
	deadline := time.Now().Add(aofWaitMax)
	for {
		info, err := r.rdb.Info(ctx, "persistence").Result()
		if err != nil {
			return fmt.Errorf("baseline: redis: INFO persistence: %w", err)
		}
		if strings.Contains(info, "aof_enabled:1") && strings.Contains(info, "aof_rewrite_in_progress:0") &&
			strings.Contains(info, "aof_rewrite_scheduled:0") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("baseline: redis: append-only file not ready after %s", aofWaitMax)
		}
		if !loadgen.Sleep(ctx, aofPollInterval) {
			return ctx.Err()
		}
	}
}

// Close deletes the run's keys, puts the server's settings back and closes
// the client.
func (r *Redis) Close() error {
	if r.rdb == nil {
		return nil
	}
	defer r.rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var errs []error
	err := r.scan(ctx, r.prefix+"*", func(keys []string) error { return r.rdb.Unlink(ctx, keys...).Err() })
	if err != nil {
		errs = append(errs, fmt.Errorf("baseline: redis: delete keys %s*: %w", r.prefix, err))
	}
	// appendonly first, so the server never runs without fsync while the
	// file is on.
	for _, p := range []string{"appendonly", "appendfsync"} {
		if v, ok := r.saved[p]; ok {
			if err := r.rdb.ConfigSet(ctx, p, v).Err(); err != nil {
				errs = append(errs, fmt.Errorf("baseline: redis: restore %s %s: %w", p, v, err))
			}
		}
	}
	return errors.Join(errs...)
}

// scan calls fn with every batch of keys matching pattern.
func (r *Redis) scan(ctx context.Context, pattern string, fn func([]string) error) error {
	var cursor uint64
	for range redisPagesMax {
		keys, next, err := r.rdb.Scan(ctx, cursor, pattern, redisPageSize).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := fn(keys); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
	return fmt.Errorf("more than %d pages of keys", redisPagesMax)
}

// Deduct takes qty units.
func (r *Redis) Deduct(ctx context.Context, sku, key string, qty int64) loadgen.Outcome {
	_, o := r.take(ctx, stock.OpDeduct, sku, key, qty, "")
	return o
}

// Reserve holds qty units.
func (r *Redis) Reserve(ctx context.Context, sku, key string, qty int64) (string, loadgen.Outcome) {
	return r.take(ctx, stock.OpReserve, sku, key, qty, newReservationID(sku))
}

func (r *Redis) take(ctx context.Context, kind stock.OpKind, sku, key string, qty int64, resID string) (string, loadgen.Outcome) {
	moved := r.sold(sku)
	if kind == stock.OpReserve {
		moved = r.reserved(sku)
	}
	keys := []string{r.idem(sku, key), r.available(sku), moved, r.ledger(), r.hold(resID)}
	v, err := r.run(ctx, takeScript, keys, string(kind), qty, sku, key, resID)
	if err != nil {
		return "", redisOutcome(ctx, err)
	}
	if len(v) != 2 {
		return "", loadgen.Error(string(stock.CodeInternal))
	}
	switch v[0] {
	case "ok":
		return resID, loadgen.OK
	case "oos":
		return "", loadgen.OutOfStock
	case "replayed":
		// The record is kind:quantity:reservation id.
		parts := strings.SplitN(v[1], ":", 3)
		if len(parts) != 3 || parts[0] != string(kind) || parts[1] != strconv.FormatInt(qty, 10) {
			return "", loadgen.Error(string(stock.CodeIdempotencyKeyReused))
		}
		return parts[2], loadgen.Replayed
	}
	return "", loadgen.Error(v[1])
}

// Commit sells a held reservation.
func (r *Redis) Commit(ctx context.Context, id string) loadgen.Outcome {
	return r.end(ctx, stock.OpCommit, id)
}

// Release returns a held reservation's units.
func (r *Redis) Release(ctx context.Context, id string) loadgen.Outcome {
	return r.end(ctx, stock.OpRelease, id)
}

func (r *Redis) end(ctx context.Context, kind stock.OpKind, id string) loadgen.Outcome {
	dot := strings.LastIndexByte(id, '.')
	if dot <= 0 {
		return loadgen.Error(string(stock.CodeReservationNotFound))
	}
	sku := id[:dot]
	state, to := stock.ReservationCommitted, r.sold(sku)
	if kind == stock.OpRelease {
		state, to = stock.ReservationReleased, r.available(sku)
	}
	keys := []string{r.hold(id), r.reserved(sku), to, r.ledger()}
	v, err := r.run(ctx, endScript, keys, string(state), string(kind), id)
	if err != nil {
		return redisOutcome(ctx, err)
	}
	switch {
	case len(v) != 2:
		return loadgen.Error(string(stock.CodeInternal))
	case v[0] == "ok":
		return loadgen.OK
	case v[0] == "replayed":
		return loadgen.Replayed
	}
	return loadgen.Error(v[1])
}

// run runs a script. go-redis does not stop waiting for a reply when ctx is
// cancelled (it only honours deadlines), so when the load generator means to
// abandon the request, run sends it on its own goroutine, tells the runner it
// is sent and gives up listening at once: the script runs, the client never
// hears the answer, as when a connection drops after the server acted.
func (r *Redis) run(ctx context.Context, s *redis.Script, keys []string, args ...any) ([]string, error) {
	if !loadgen.Abandoning(ctx) {
		return s.Run(ctx, r.rdb, keys, args...).StringSlice()
	}
	type reply struct {
		v   []string
		err error
	}
	// The script outlives this call, not the attempt's deadline.
	detached, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok {
		detached, cancel = context.WithDeadline(detached, dl)
	}
	done := make(chan reply, 1)
	go func() {
		defer cancel()
		v, err := s.Run(detached, r.rdb, keys, args...).StringSlice()
		done <- reply{v, err}
	}()
	loadgen.Sent(ctx)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case rep := <-done:
		return rep.v, rep.err
	}
}

// redisOutcome classifies a failed call: the context's end, else
// UNAVAILABLE. Neither is definite: the script may have run.
func redisOutcome(ctx context.Context, err error) loadgen.Outcome {
	if o, ok := loadgen.ErrorFromContext(ctx); ok {
		return o
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return loadgen.Error(loadgen.CodeDeadlineExceeded)
	}
	return loadgen.Outcome{Status: loadgen.StatusError, Code: loadgen.CodeUnavailable, Detail: err.Error()}
}

// ledgerSums are one SKU's ledger totals.
type ledgerSums struct {
	da, dr, ds int64
	keys       map[string]bool
	ends       map[string]bool // reservations with an end entry
	endEntries int64
}

// Verify reads the counters, sums the ledger stream per SKU against them,
// and checks the idempotency records and held reservations.
func (r *Redis) Verify(ctx context.Context, skus []loadgen.SKUSpec) (loadgen.State, error) {
	st := loadgen.State{SKUs: make(map[string]loadgen.SKUState, len(skus))}
	fail := func(what string, err error) (loadgen.State, error) {
		return loadgen.State{}, fmt.Errorf("baseline: %s: verify: %s: %w", r.Name(), what, err)
	}
	initial := map[string]int64{}
	pipe := r.rdb.Pipeline()
	cmds := make([][4]*redis.StringCmd, len(skus))
	for i, s := range skus {
		cmds[i] = [4]*redis.StringCmd{pipe.Get(ctx, r.available(s.SKU)), pipe.Get(ctx, r.reserved(s.SKU)),
			pipe.Get(ctx, r.sold(s.SKU)), pipe.Get(ctx, r.initial(s.SKU))}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fail("counters", err)
	}
	for i, s := range skus {
		var v [4]int64
		for j, c := range cmds[i] {
			n, err := c.Int64()
			if err != nil {
				return fail("counter "+c.Args()[1].(string), err)
			}
			v[j] = n
		}
		st.SKUs[s.SKU] = loadgen.SKUState{Available: v[0], Reserved: v[1], Sold: v[2], Ledger: map[string]int64{}}
		initial[s.SKU] = v[3]
	}

	sums := map[string]*ledgerSums{}
	start := "-"
	for page := 0; ; page++ {
		if page == redisPagesMax {
			return fail("ledger", fmt.Errorf("more than %d pages", redisPagesMax))
		}
		msgs, err := r.rdb.XRangeN(ctx, r.ledger(), start, "+", redisPageSize).Result()
		if err != nil {
			return fail("ledger", err)
		}
		for _, m := range msgs {
			sku, _ := m.Values["sku"].(string)
			kind, _ := m.Values["kind"].(string)
			s, ok := st.SKUs[sku]
			if !ok {
				continue
			}
			s.Ledger[kind]++
			l := sums[sku]
			if l == nil {
				l = &ledgerSums{keys: map[string]bool{}, ends: map[string]bool{}}
				sums[sku] = l
			}
			l.da += streamInt(m.Values["da"])
			l.dr += streamInt(m.Values["dr"])
			l.ds += streamInt(m.Values["ds"])
			if kind == string(stock.OpDeduct) || kind == string(stock.OpReserve) {
				s.Operations++
				key, _ := m.Values["key"].(string)
				l.keys[key] = true
			}
			if kind == string(stock.OpCommit) || kind == string(stock.OpRelease) || kind == string(stock.OpExpire) {
				res, _ := m.Values["res"].(string)
				l.ends[res] = true
				l.endEntries++
			}
			st.SKUs[sku] = s
		}
		if len(msgs) < redisPageSize {
			break
		}
		start = "(" + msgs[len(msgs)-1].ID
	}

	records := map[string]int64{}
	err := r.scan(ctx, r.key("k:*"), func(keys []string) error {
		for _, k := range keys {
			sku, _, _ := strings.Cut(strings.TrimPrefix(k, r.key("k:")), "|")
			records[sku]++
		}
		return nil
	})
	if err != nil {
		return fail("idempotency records", err)
	}
	held := map[string]int64{}
	err = r.scan(ctx, r.key("h:*"), func(keys []string) error {
		pipe := r.rdb.Pipeline()
		cmds := make([]*redis.SliceCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.HMGet(ctx, k, "sku", "qty", "state")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		for _, c := range cmds {
			v := c.Val()
			if len(v) == 3 && v[2] == string(stock.ReservationHeld) {
				sku, _ := v[0].(string)
				held[sku] += streamInt(v[1])
			}
		}
		return nil
	})
	if err != nil {
		return fail("reservations", err)
	}

	for _, spec := range skus {
		s := st.SKUs[spec.SKU]
		l := sums[spec.SKU]
		if l == nil {
			l = &ledgerSums{}
		}
		s.DistinctKeys = int64(len(l.keys))
		s.ExtraEnds = l.endEntries - int64(len(l.ends))
		add := func(check, detail string, want, got int64) {
			if want != got {
				s.Discrepancies = append(s.Discrepancies, loadgen.Discrepancy{Check: check, Detail: detail, Expected: want, Actual: got})
			}
		}
		add("ledger_balance", "available: opening balance plus ledger against the counter", initial[spec.SKU]+l.da, s.Available)
		add("ledger_balance", "reserved: ledger against the counter", l.dr, s.Reserved)
		add("ledger_balance", "sold: ledger against the counter", l.ds, s.Sold)
		add("operation_ledger", "idempotency records against deduct and reserve ledger entries", records[spec.SKU], s.Operations)
		add("reserved_holds", "held reservations against the counter", held[spec.SKU], s.Reserved)
		st.SKUs[spec.SKU] = s
	}
	return st, nil
}

func streamInt(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
