// Package allocator is the public front door's logic: it routes each
// idempotent request to a shard with stock, coalesces the requests bound for
// one shard server into one call, checks every shard before it answers
// OUT_OF_STOCK, and has the rebalancer (internal/rebalance, which runs in
// the allocator's process) consolidate fragmented stock with transfers.
package allocator

import (
	"cmp"
	"context"
	"hash/fnv"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"github.com/shardstock/shardstock/internal/pause"
	"github.com/shardstock/shardstock/internal/rebalance"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// Bounds of routing.
const (
	// routeRoundsMax bounds the rounds of try-shards, sold-out check, consolidate
	// that one request may take.
	routeRoundsMax = 4
	// skuCacheTTL is how long a SKU's configuration is trusted. The shard
	// servers check status and limits in every batch regardless; the
	// allocator uses its copy to route (the shard count, which SetShards
	// and the rebalancer's automatic split and merge change: this allocator
	// forgets its copy when it changes the count or a sold-out check finds another
	// layout) and to word refusals. A short TTL costs a cold SKU a
	// query for nearly every request (docs/benchmarks.md measured it); a
	// change made through another allocator shows here within this TTL.
	skuCacheTTL = 10 * time.Second
	// skuRefreshInterval is how often the SKUs requested since their read
	// are read again, in batches, once past half their TTL
	// (refreshSKUs): a SKU asked for at least once in every such interval
	// never waits for a read of its configuration.
	skuRefreshInterval = skuCacheTTL / 2
	// skuRefreshBatchMax bounds the SKUs one statement of a refresh reads,
	// and skuRefreshMax those of one refresh: the rest expire and are read
	// when next asked for, as without a refresh.
	skuRefreshBatchMax = 1024
	skuRefreshMax      = 8 * skuRefreshBatchMax
	// inTransitWait is the pause before retrying when the stock a request
	// needs is in transit.
	inTransitWait = 50 * time.Millisecond
	// ownerMovesMax bounds how often one request follows its partition to
	// a new owner (abandonMoved). Each move is an ownership change seen in
	// etcd; more than this within one request means the topology is
	// churning, and the caller gets SHARD_UNAVAILABLE (retry, same key).
	ownerMovesMax = 3
	// skuCacheLenMax bounds the SKUs whose configuration is cached; the
	// least recently used is evicted first. A SKU cached costs a few hundred
	// bytes, so this is tens of MB at most; a SKU evicted costs one query
	// when it is next asked for, as after its TTL.
	skuCacheLenMax = 1 << 16
	// skuGenStripes is how many stripes the SKU cache's invalidations are
	// counted in: a forget drops the reads under way of its stripe's SKUs
	// (each costs one more query later), so more stripes spare more of
	// them, at 8 bytes each.
	skuGenStripes = 256
	// hintsSKUsMax bounds the SKUs whose shards' hints are kept (16 bytes
	// a shard: 4 MiB for as many SKUs of 8 shards, 128 MiB if every one had
	// 256); the least recently used SKU is evicted first. A shard without a
	// hint is tried as unknown, which costs at most one call that refuses.
	hintsSKUsMax = 1 << 15
	// inTransitScrapeTimeout bounds the query behind the in-transit gauge.
	inTransitScrapeTimeout = 2 * time.Second
)

// Config configures an Allocator.
type Config struct {
	// DB is the database set; nil (tests of routing and memory alone)
	// runs no rebalancer rounds, which read it.
	DB Store
	// Topology returns the current view of shard servers and owners.
	Topology func() topology.View
	// HTTPClient reaches the shard servers (cleartext HTTP/2); the default
	// sends keep-alive pings (transport.NewInternalClient).
	HTTPClient *http.Client
	// ShardScheme is "https" when HTTPClient speaks TLS to the shard
	// servers (transport.NewInternalTLSClient); "" means "http".
	ShardScheme string
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
	// Local, when set, is a shard server running in this process under
	// the id LocalID: requests for the partitions it owns are handed to it
	// directly instead of over RPC (the same writers, fences and batches;
	// no HTTP/2 hop, no protobuf, no second process to wake).
	Local   LocalServer
	LocalID string
	// Moves hands out the SKUs' move leases (etcd); nil moves stock under
	// token 0 (tests without etcd).
	Moves *topology.MoveLeases
	// Rebalance configures the rebalancer.
	Rebalance rebalance.Config
	// Orders keeps orders (the database named main); nil: the order calls
	// answer UNIMPLEMENTED.
	Orders OrderStore
	// OrderRecoveryOff: this allocator does not take over orders whose
	// driver stopped (tests; a deployment keeps it on in every allocator).
	OrderRecoveryOff bool
	// OrderHook, for tests, is called before each line of an order is taken.
	OrderHook func(o *stock.Order, line int)
	// SoldOut, when set, are the SKUs' sold-out marks (etcd): a new key
	// of a SKU sold out for good is refused from memory (docs/soldout.md).
	// Its Run must be running. nil: every refusal is checked.
	SoldOut *topology.SoldOut
}

// LocalServer is a shard server in the allocator's own process
// (shard.Server).
type LocalServer interface {
	Do(ctx context.Context, r *stock.Request) stock.Result
}

// Allocator routes requests over the shard servers.
type Allocator struct {
	db      RouteStore
	admin   AdminStore
	topo    func() topology.View
	hc      *http.Client
	scheme  string // of the shard servers' URLs
	log     *slog.Logger
	local   LocalServer
	localID string

	mu      sync.Mutex
	servers map[string]*serverClient // by id + "@" + addr
	// hints and skus lock themselves; they are bounded (hintsSKUsMax,
	// skuCacheLenMax) so that a million SKUs do not grow them without end.
	// A SKU's hints are one entry, so that routing a request costs one
	// lookup, not one per shard.
	hints *lru.Cache[string, *skuHints]
	skus  *lru.Cache[string, *cachedSKU]
	// skuGens orders the SKU cache's fills after its invalidations: a
	// forget bumps its SKU's stripe, and a read that began before is
	// answered but not kept (it may hold what the forget was for).
	skuMu   sync.Mutex
	skuGens [skuGenStripes]uint64
	// transitWait is inTransitWait; longer in tests.
	transitWait time.Duration

	checks    checker
	memory    memory    // the sold-out answered from memory
	inflight  sync.Map  // sku + "\x00" + key -> struct{}: OPERATION_IN_PROGRESS
	doubts    doubtBook // keys a shard may still apply: OPERATION_IN_PROGRESS
	metrics   *metrics
	stop      chan struct{} // closed by Close: ends followTopology and refreshes
	followed  chan struct{} // closed when followTopology has returned
	refreshed chan struct{} // closed when the SKU cache's refreshes have returned

	// rebal moves stock: the rounds, SetShards, Rebalance and the
	// consolidations routing asks for.
	rebal *rebalance.Rebalancer

	orders    OrderStore
	driverID  string // this allocator, as the driver of the orders it works on (newDriver)
	orderHook func(o *stock.Order, line int)
	recovered chan struct{} // closed when recoverOrders has returned
	// drives are the orders' drives at work, which outlive their callers
	// (ReserveOrder); Close waits for them, at most orderAwaitMax.
	drives sync.WaitGroup
}

type cachedSKU struct {
	sku     *stock.SKU
	fetched time.Time
	used    atomic.Bool // asked for since it was read: refreshSKUs reads it again
}

// skuBatchReader reads many SKUs' configurations at once (postgres.DB,
// dbset.Set); a store without it has no refresh.
type skuBatchReader interface {
	GetSKUs(ctx context.Context, names []string) (map[string]*stock.SKU, error)
}

// New returns an Allocator.
func New(cfg Config) *Allocator {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = transport.NewInternalClient()
	}
	a := &Allocator{
		db:          cfg.DB,
		admin:       cfg.DB,
		topo:        cfg.Topology,
		local:       cfg.Local,
		localID:     cfg.LocalID,
		hc:          hc,
		scheme:      cmp.Or(cfg.ShardScheme, "http"),
		log:         log,
		servers:     map[string]*serverClient{},
		hints:       mustLRU[string, *skuHints](hintsSKUsMax),
		skus:        mustLRU[string, *cachedSKU](skuCacheLenMax),
		transitWait: inTransitWait,
		metrics:     newMetrics(cfg.Registerer),
		stop:        make(chan struct{}),
		followed:    make(chan struct{}),
		refreshed:   make(chan struct{}),
		orders:      cfg.Orders,
		driverID:    "allocator-" + stock.NewTransferID()[3:19],
		orderHook:   cfg.OrderHook,
		recovered:   make(chan struct{}),
	}
	a.checks.a, a.checks.keysMax = a, checkKeysMax
	a.memory.init(cfg.SoldOut)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shardstock_units_in_transit", Help: "Units of every SKU debited by a transfer and not yet credited (read from the database at each scrape; -1 if it could not be read).",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), inTransitScrapeTimeout)
			defer cancel()
			n, err := a.admin.InTransitTotal(ctx)
			if err != nil {
				return -1
			}
			return float64(n)
		}))
	}
	a.rebal = rebalance.New(rebalance.Host{Store: cfg.DB, Exec: a.exec, SKU: a.sku, Forget: a.forgetSKU,
		Moves: cfg.Moves, Logger: log, Registerer: cfg.Registerer}, cfg.Rebalance)
	go a.followTopology()
	go a.refreshSKUs(skuRefreshInterval)
	if a.orders != nil && !cfg.OrderRecoveryOff {
		go func() { defer close(a.recovered); a.recoverOrders() }()
	} else {
		close(a.recovered)
	}
	return a
}

// mustLRU returns an LRU cache of size entries at most; lru.New fails only
// for a size below 1, which the constants rule out.
func mustLRU[K comparable, V any](size int) *lru.Cache[K, V] {
	c, err := lru.New[K, V](size)
	if err != nil {
		panic(err)
	}
	return c
}

// Close stops the allocator's background work and waits for it: the
// topology follower, the rebalancer and SetShards's moves still settling;
// then it closes every shard-server client. Call it once.
func (a *Allocator) Close() {
	close(a.stop)
	<-a.followed
	<-a.refreshed
	<-a.recovered
	drove := make(chan struct{})
	go func() { a.drives.Wait(); close(drove) }()
	select {
	case <-drove:
	case <-time.After(orderAwaitMax): // a drive left unfinished is recovered elsewhere
	}
	a.rebal.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, c := range a.servers {
		c.close()
		delete(a.servers, k)
	}
}

// Ready reports whether every partition has a live owner.
func (a *Allocator) Ready() bool { return a.topo().AllOwned() }

// sku returns a SKU's configuration, cached for skuCacheTTL from when its
// read began. A read that overlaps a forget of the SKU (UpdateSKU through
// this allocator, a new layout) is not kept: it may have read the SKU as
// it was before, and would hide the change for skuCacheTTL.
func (a *Allocator) sku(ctx context.Context, name string) (*stock.SKU, error) {
	if c, ok := a.skus.Get(name); ok && time.Since(c.fetched) < skuCacheTTL {
		if !c.used.Load() { // one write per read, not per request
			c.used.Store(true)
		}
		return c.sku, nil
	}
	return a.readSKU(ctx, name)
}

// readSKU reads a SKU's configuration from its database, and caches it
// for routing as sku does. GetStock reads through it too: a SKU just
// created (CreateSKU answers with GetStock) or looked at is often about to
// be sold, and its first request then finds it cached.
func (a *Allocator) readSKU(ctx context.Context, name string) (*stock.SKU, error) {
	stripe := skuGenStripe(name)
	a.skuMu.Lock()
	gen := a.skuGens[stripe]
	a.skuMu.Unlock()
	began := time.Now()
	s, err := a.db.GetSKU(ctx, name)
	if err != nil {
		return nil, err
	}
	a.skuMu.Lock()
	defer a.skuMu.Unlock()
	if a.skuGens[stripe] == gen {
		a.skus.Add(name, &cachedSKU{sku: s, fetched: began})
	}
	return s, nil
}

// refreshSKUs, every interval until Close, reads again the SKUs asked for
// since their read that are past half their TTL (at most skuRefreshMax),
// in statements of skuRefreshBatchMax: a few statements instead of one
// read per SKU and TTL on the requests' path. A refreshed SKU is cached
// from when its batch's read began, so it is never older than a read on
// the path would be; one a forget overlapped is not kept (readSKU).
func (a *Allocator) refreshSKUs(interval time.Duration) {
	defer close(a.refreshed)
	br, ok := a.db.(skuBatchReader)
	if !ok {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		a.refreshDue(br)
	}
}

// refreshDue is one refresh: the SKUs due, in batches.
func (a *Allocator) refreshDue(br skuBatchReader) {
	var due []string
	now := time.Now()
	for _, name := range a.skus.Keys() {
		c, ok := a.skus.Peek(name)
		if !ok || !c.used.Load() {
			continue
		}
		if age := now.Sub(c.fetched); age >= skuCacheTTL/2 && age < skuCacheTTL {
			if due = append(due, name); len(due) == skuRefreshMax {
				break
			}
		}
	}
	for batch := range slices.Chunk(due, skuRefreshBatchMax) {
		a.refreshBatch(br, batch)
	}
}

// refreshBatch reads names again and caches each found, unless a forget
// of its stripe overlapped the read.
func (a *Allocator) refreshBatch(br skuBatchReader, names []string) {
	a.skuMu.Lock()
	gens := a.skuGens
	a.skuMu.Unlock()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), skuCacheTTL/2)
	defer cancel()
	got, err := br.GetSKUs(ctx, names)
	if err != nil {
		a.log.Debug("SKU cache: refresh failed; the SKUs are read when next asked for", "skus", len(names), "err", err)
	}
	a.skuMu.Lock()
	defer a.skuMu.Unlock()
	for name, s := range got {
		if stripe := skuGenStripe(name); a.skuGens[stripe] == gens[stripe] {
			a.skus.Add(name, &cachedSKU{sku: s, fetched: began})
		}
	}
}

// SKU returns a SKU's configuration, as cached for routing (skuCacheTTL).
func (a *Allocator) SKU(ctx context.Context, name string) (*stock.SKU, error) {
	return a.sku(ctx, name)
}

// forgetSKU drops a SKU's cached configuration, and keeps no read of it
// that is under way (sku).
func (a *Allocator) forgetSKU(name string) {
	a.skuMu.Lock()
	defer a.skuMu.Unlock()
	a.skuGens[skuGenStripe(name)]++
	a.skus.Remove(name)
}

// skuGenStripe is the stripe of skuGens a SKU's forgets bump.
func skuGenStripe(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32() % skuGenStripes
}

// client returns the client of the server that owns shard k, or nil; local
// is true when that server is the one in this process.
func (a *Allocator) client(k stock.ShardKey) (c *serverClient, local bool) {
	srv, _, ok := a.topo().Owner(k.Partition())
	if !ok {
		return nil, false
	}
	if a.local != nil && srv.ID == a.localID {
		return nil, true
	}
	return a.remote(srv), false
}

// remote returns the RPC client of a shard server, made on first use.
func (a *Allocator) remote(srv topology.Server) *serverClient {
	id := srv.ID + "@" + srv.Addr
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.servers[id]
	if c == nil {
		c = newServerClient(srv.ID, a.scheme, srv.Addr, a.hc, a.topo, func(name string, to gobreaker.State) {
			a.log.Warn("shard server circuit breaker", "server", name, "state", to.String())
			a.metrics.breaker.WithLabelValues(name, to.String()).Inc()
		}, a.metrics.server(srv.ID))
		a.servers[id] = c
	}
	return c
}

// followTopology abandons the calls to a partition's old owner whenever
// the topology changes (serverClient.abandonMoved), until Close.
func (a *Allocator) followTopology() {
	defer close(a.followed)
	if a.topo == nil {
		return
	}
	for {
		// Take the view before looking, so that a change made while we
		// look closes its Changed and is looked at again.
		v := a.topo()
		a.mu.Lock()
		clients := make([]*serverClient, 0, len(a.servers))
		for _, c := range a.servers {
			clients = append(clients, c)
		}
		a.mu.Unlock()
		for _, c := range clients {
			c.abandonMoved(v)
		}
		a.forgetGone(v)
		select {
		case <-v.Changed():
		case <-a.stop:
			return
		}
	}
}

// forgetGone closes and drops the clients of shard servers that v no
// longer lists (at that address) and that have no call pending, so that
// servers that come and go leave no client behind. A call that takes such
// a client after all finds its server gone and is sent to the partition's
// current owner (serverClient.do).
func (a *Allocator) forgetGone(v topology.View) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, c := range a.servers {
		if srv, ok := v.Server(c.id); (ok && srv.Addr == c.addr) || c.busy() {
			continue
		}
		c.close()
		delete(a.servers, k)
	}
}

// exec sends one request to its shard's owner and keeps the answer's hint.
// When the partition gets a new owner while the request waits for the old
// one, it is sent again to the new owner (at most ownerMovesMax times).
func (a *Allocator) exec(ctx context.Context, r *stock.Request) stock.Result {
	res, _ := a.send(ctx, r)
	return res
}

// send is exec, and also reports whether the request reached a shard
// server (was handed to one, whatever came back): a request that did and
// was answered SHARD_UNAVAILABLE may still be applied there.
func (a *Allocator) send(ctx context.Context, r *stock.Request) (res stock.Result, reached bool) {
	for moves := 0; ; moves++ {
		c, local := a.client(r.Shard)
		var moved bool
		switch {
		case local:
			a.metrics.local.Inc()
			res, reached = a.local.Do(ctx, r), true
		case c == nil:
			return unavailable("no shard server owns %s right now; retry with the same key", r.Shard), reached
		case c.open():
			return unavailable("shard server %s is failing; retry with the same key", c.id), reached
		default:
			a.metrics.remote.Inc()
			reached = true
			res, moved = c.do(ctx, wire.RequestToProto(r), r.Shard.Partition())
		}
		if !moved {
			break
		}
		if moves+1 >= ownerMovesMax {
			return unavailable("the owner of %s changed %d times during the request; retry with the same key", r.Shard, ownerMovesMax), reached
		}
	}
	if res.Err == nil || res.Err.Code != stock.CodeShardUnavailable {
		a.setHint(r.Shard, hint{available: res.Available, known: true})
	}
	return res, reached
}

// skuHints are the hints of one SKU's shards, by index.
type skuHints struct {
	mu sync.Mutex
	hs []hint
}

// setHint records what k's shard was last seen to hold.
func (a *Allocator) setHint(k stock.ShardKey, hs hint) {
	h, ok := a.hints.Get(k.SKU)
	if !ok {
		// Added only if still absent: two first hints of one SKU at once
		// share the entry one of them added.
		h = &skuHints{}
		if prev, found, _ := a.hints.PeekOrAdd(k.SKU, h); found {
			h = prev
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if int(k.Index) >= len(h.hs) {
		h.hs = append(h.hs, make([]hint, int(k.Index)+1-len(h.hs))...)
	}
	h.hs[k.Index] = hs
}

// hintsOf returns the hints of a SKU's n shards; an evicted one is unknown.
func (a *Allocator) hintsOf(sku string, n int32) []hint {
	hs := make([]hint, n)
	if h, ok := a.hints.Get(sku); ok {
		h.mu.Lock()
		copy(hs, h.hs)
		h.mu.Unlock()
	}
	return hs
}

// firstChoice is the key's stable first shard.
func firstChoice(key string, n int32) int32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int32(h.Sum32() % uint32(n))
}

// skipper returns a predicate that skips shards whose server is unknown or
// failing.
func (a *Allocator) skipper(sku string) func(int32) bool {
	return func(i int32) bool {
		c, local := a.client(stock.ShardKey{SKU: sku, Index: i})
		return !local && (c == nil || c.open())
	}
}

// take routes a request that takes q available units (reserve, deduct, a
// negative adjustment): try the shards that may have enough, then check
// them all (the sold-out check); answer OUT_OF_STOCK only when it (counting stock in
// transit) says the SKU holds less than q; consolidate when the stock is
// there but split. doubt lists the shards that may still apply r; it is
// not empty only when the answer is SHARD_UNAVAILABLE.
func (a *Allocator) take(ctx context.Context, r *stock.Request, sku *stock.SKU) (res stock.Result, doubt []int32) {
	res = a.route(ctx, r, sku, &doubt)
	switch {
	case len(doubt) == 0 || res.Err == nil:
		// A success anywhere holds the key in the SKU's database: a shard
		// in doubt can no longer apply it (its insert conflicts, a replay).
		return res, nil
	case res.Err.Code == stock.CodeShardUnavailable:
		return res, doubt
	}
	return a.settleDoubt(ctx, r, res, doubt)
}

// settleDoubt answers a request that route refused (out of stock, or by the
// SKU's rules) while some shards may still apply it: a call to them came
// back SHARD_UNAVAILABLE after it reached them (a ping timeout, a lost
// connection, a call abandoned for a new owner, a deadline), and the op may
// sit in their writer's queue or batch. The refusal must not be final then:
// the buyer would be told no and sold the unit. So it sends the request
// again, with the same key, to each of them: a shard's writer decides its
// queue in order, and a new owner fences the old one before it writes, so
// that answer comes after the first copy's fate is sealed: a success (the
// first copy's result replayed, or applied now, once) is the answer; a
// refusal from that shard settles it; SHARD_UNAVAILABLE leaves the doubt,
// and the answer is SHARD_UNAVAILABLE (retry with the same key), never a
// refusal. Only requests that had a shard fail them get here.
func (a *Allocator) settleDoubt(ctx context.Context, r *stock.Request, refusal stock.Result, doubt []int32) (stock.Result, []int32) {
	for i, idx := range doubt {
		rr := *r
		rr.Shard.Index = idx
		res := a.exec(ctx, &rr)
		switch {
		case res.Err == nil:
			a.metrics.settles.WithLabelValues("served").Inc()
			return res, nil
		case res.Err.Code == stock.CodeShardUnavailable:
			a.metrics.settles.WithLabelValues("unavailable").Inc()
			return unavailable("shard %d of %s may still apply the request; retry with the same key", idx, r.Shard.SKU), doubt[i:]
		}
	}
	a.metrics.settles.WithLabelValues("refused").Inc()
	return refusal, nil
}

// route is take's rounds; it adds to doubt the shards that may still apply
// r.
func (a *Allocator) route(ctx context.Context, r *stock.Request, sku *stock.SKU, doubt *[]int32) stock.Result {
	q := r.Quantity
	if r.Kind == stock.OpAdjust {
		q = -r.Quantity
	}
	first := firstChoice(r.Key, sku.Shards)
	a.rebal.AddDemand(sku.Name, first, q)
	var last stock.Result
	for round := 0; round < routeRoundsMax; round++ {
		res, asked, done := a.tryShards(ctx, r, sku, q, first, doubt)
		if done {
			return res
		}
		if res.Err != nil {
			last = res
		}
		// A shard that refused the request in this call looked its key up
		// in its own transaction: the sold-out check need not look it up again.
		key := r.Key
		if asked {
			key = ""
		}
		chk := a.checks.check(ctx, sku, key)
		if chk.err != nil {
			return stock.Result{Err: chk.err}
		}
		if fresh, err := a.sku(ctx, sku.Name); err == nil {
			sku = fresh // the check forgets a layout that SetShards changed
		}
		if sku, res, done = a.afterCheck(ctx, r, sku, q, asked, chk); done {
			return res
		}
		if res.Err != nil {
			last = res
		}
	}
	if last.Err != nil {
		return last
	}
	return unavailable("could not place the request in %d rounds; retry with the same key", routeRoundsMax)
}

// tryShards tries the candidate shards for q units in order. done: res is
// the answer (a success, or a refusal that no other shard would change);
// else res is the last SHARD_UNAVAILABLE, if any, and asked tells whether
// a shard refused the request for stock. A shard that the request reached
// and that answered SHARD_UNAVAILABLE is added to doubt; one that refused
// it for stock since is taken out (its refusal came after that copy).
func (a *Allocator) tryShards(ctx context.Context, r *stock.Request, sku *stock.SKU, q int64, first int32, doubt *[]int32) (res stock.Result, asked, done bool) {
	var last stock.Result
	for idx := range candidates(sku.Shards, first, a.hintsOf(sku.Name, sku.Shards), q, a.skipper(sku.Name)) {
		if idx != first {
			a.metrics.reroutes.Inc()
		}
		rr := *r
		rr.Shard.Index = idx
		res, reached := a.send(ctx, &rr)
		if res.Err == nil {
			return res, asked, true
		}
		switch res.Err.Code {
		case stock.CodeOutOfStock:
			asked = true
			if len(*doubt) > 0 {
				*doubt = slices.DeleteFunc(*doubt, func(i int32) bool { return i == idx })
			}
		case stock.CodeShardUnavailable:
			last = res
			if reached && !slices.Contains(*doubt, idx) {
				*doubt = append(*doubt, idx)
			}
		default:
			return res, asked, true
		}
		if ctx.Err() != nil {
			return unavailable("deadline passed while routing; retry with the same key"), asked, true
		}
	}
	return last, asked, false
}

// afterCheck decides, from a sold-out check of every shard, what the next round
// does: answer (done), wait for shards or stock in transit, consolidate
// fragmented stock, or just try again with fresh hints. It returns the SKU
// as the next round sees it, and any SHARD_UNAVAILABLE to answer should the
// rounds run out.
func (a *Allocator) afterCheck(ctx context.Context, r *stock.Request, sku *stock.SKU, q int64, asked bool, chk checkResult) (*stock.SKU, stock.Result, bool) {
	switch {
	case chk.available+chk.inTransit < q && chk.unknown == 0:
		if chk.forGood {
			a.markSoon(sku.Name)
		}
		return sku, a.outOfStock(ctx, r, sku, asked, chk), true
	case chk.available+chk.inTransit < q:
		// Shards that did not answer, or are halted, may hold the stock:
		// not a sold-out. A partition changing hands answers again in
		// moments; a halted shard when an operator resumes it.
		if !pause.For(ctx, a.transitWait) {
			return sku, unavailable("deadline passed while shards of %s were unreachable or halted; retry with the same key", sku.Name), true
		}
		return sku, unavailable("some shards of %s holding stock are unreachable or halted; retry with the same key", sku.Name), false
	case chk.maxShard >= q:
		return sku, stock.Result{}, false // a shard holds enough now: try again with fresh hints
	case refused(r, sku):
		// The cached SKU refuses this request whatever the stock. The copy
		// may be up to skuCacheTTL old (a SKU resumed through another
		// allocator), and here it decides, not only words, the answer: read
		// it again before refusing rather than moving stock. Rare: only a
		// request larger than any one shard.
		a.forgetSKU(sku.Name)
		fresh, err := a.sku(ctx, sku.Name)
		if err != nil {
			return sku, unavailable("could not read %s; retry with the same key", sku.Name), true
		}
		if refused(r, fresh) {
			return fresh, a.outOfStock(ctx, r, fresh, false, chk), true
		}
		return fresh, stock.Result{}, false
	case chk.available >= q:
		if err := a.consolidate(ctx, sku, q); err != nil {
			a.log.Debug("consolidation failed", "sku", sku.Name, "err", err)
		}
		return sku, stock.Result{}, false
	}
	// Enough only with what is in transit: let it land.
	if !pause.For(ctx, a.transitWait) {
		return sku, unavailable("deadline passed while stock of %s was in transit; retry with the same key", sku.Name), true
	}
	return sku, stock.Result{}, false
}

// refused reports whether the SKU's configuration (as cached) refuses r
// whatever the stock; the shards decide the same with fresh data.
func refused(r *stock.Request, sku *stock.SKU) bool {
	// No clock: the sale window is decided only by a batch's database
	// clock (stock.SKU.Refuse), never by this process's.
	return sku.Refuse(r, 0, time.Time{}) != nil
}

// outOfStock answers a request the sold-out check found no stock for. When a shard
// refused it during this call, that shard looked the key up in its
// transaction already. Otherwise the sold-out check looked it up: a replay goes to
// the shard that recorded it and gets its first result even after the SKU
// sold out; a new key gets the SKU's most specific refusal.
func (a *Allocator) outOfStock(ctx context.Context, r *stock.Request, sku *stock.SKU, asked bool, chk checkResult) stock.Result {
	if !asked {
		if chk.ops == nil {
			return unavailable("could not check the key; retry with the same key")
		}
		if op := chk.ops[r.Key]; op != nil {
			rr := *r
			rr.Shard.Index = op.Shard
			return a.exec(ctx, &rr)
		}
		return refusal(r, sku)
	}
	return stock.Result{Err: stock.Errorf(stock.CodeOutOfStock, "not enough stock of %s", r.Shard.SKU)}
}
