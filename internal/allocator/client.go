package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/sony/gobreaker/v2"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/batch"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// Bounds of a shard-server client.
const (
	// rpcsSteady: each server gets this many Execute calls at once while
	// they answer within rpcSlotHoldMax; what queues meanwhile rides the
	// next call (smart batching again). The shard server groups what
	// arrives during a group's commit anyway, so more calls in flight only
	// cut the ops into more HTTP/2 calls, each costing both processes a
	// call's CPU: with 16, a call carried 1.3 ops under a hot SKU.
	rpcsSteady = 2
	// rpcSlotHoldMax: a call slower than this gives its place up, so that
	// a slow op (a shard's long queue, a lock) holds back the server's
	// others by at most this much; rpcsInFlightMax bounds the calls then.
	rpcSlotHoldMax  = 50 * time.Millisecond
	rpcsInFlightMax = 16
	// opsPerRPCMax caps the ops coalesced into one Execute call.
	opsPerRPCMax = 512
	// clientQueueLenMax bounds the ops waiting for a server.
	clientQueueLenMax = 8192
	// breakerFailuresMax consecutive transport failures open the breaker;
	// it lets a probe through after breakerOpenTimeout.
	breakerFailuresMax = 5
	breakerOpenTimeout = 2 * time.Second
	// breakerSlowCallMin: a call that ran out of deadline sooner than this
	// does not count against its server (see send).
	breakerSlowCallMin = 50 * time.Millisecond
)

// call is one op waiting for its shard server.
type call struct {
	ctx       context.Context
	op        *v1.ShardOp
	partition int32
	done      chan stock.Result // buffered 1
	// moved is closed when the call is abandoned because its partition
	// has another owner (or none) now; its caller then stops waiting.
	moved chan struct{}

	// Guarded by serverClient.mu.
	abandoned bool
	flight    *flight // the Execute call that carries it, once sent
}

// flight is one Execute call in progress.
type flight struct {
	cancel context.CancelCauseFunc
	live   int // its calls not abandoned yet; at 0 it is canceled
}

// serverClient talks to one shard server: it coalesces the ops bound for
// it into Execute calls and trips a circuit breaker when it fails.
type serverClient struct {
	id, addr string
	client   shardstockv1connect.ShardServiceClient
	breaker  *gobreaker.CircuitBreaker[*connect.Response[v1.ExecuteResponse]]
	queue    chan *call
	stop     chan struct{}
	slots    chan struct{} // a place among the rpcsSteady calls
	// holdMax is rpcSlotHoldMax; a test that holds calls on purpose sets
	// it before the client's first op.
	holdMax time.Duration
	// topo is the allocator's current topology view.
	topo    func() topology.View
	metrics serverMetrics

	mu      sync.Mutex
	pending map[*call]struct{} // queued or in flight, until their caller stops waiting
}

// newServerClient returns the client of shard server id at addr (host and
// port), reached with scheme ("http" or "https").
func newServerClient(id, scheme, addr string, hc *http.Client, topo func() topology.View, onState func(id string, to gobreaker.State), m serverMetrics) *serverClient {
	c := &serverClient{
		id:      id,
		addr:    addr,
		client:  shardstockv1connect.NewShardServiceClient(hc, scheme+"://"+addr, transport.InternalClientOptions()...),
		queue:   make(chan *call, clientQueueLenMax),
		stop:    make(chan struct{}),
		slots:   make(chan struct{}, rpcsSteady),
		holdMax: rpcSlotHoldMax,
		topo:    topo,
		metrics: m,
		pending: map[*call]struct{}{},
	}
	c.breaker = gobreaker.NewCircuitBreaker[*connect.Response[v1.ExecuteResponse]](gobreaker.Settings{
		Name:        id,
		MaxRequests: 1,
		Timeout:     breakerOpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= breakerFailuresMax },
		OnStateChange: func(name string, _, to gobreaker.State) {
			if onState != nil {
				onState(name, to)
			}
		},
		// Only transport failures count: a shard answering "out of stock"
		// or a caller giving up is not the server failing.
		IsSuccessful: func(err error) bool {
			return err == nil || errors.Is(err, context.Canceled) || connect.CodeOf(err) == connect.CodeCanceled ||
				errors.Is(err, errLateCaller)
		},
		// A call abandoned for a partition's new owner says nothing of
		// this server either way: counted as a success it would reset the
		// failures of a stopped server, whose calls are the ones abandoned.
		IsExcluded: func(err error) bool { return errors.Is(err, errAbandoned) },
	})
	for range rpcsInFlightMax {
		go c.loop()
	}
	return c
}

// open reports whether the breaker refuses calls now.
func (c *serverClient) open() bool { return c.breaker.State() == gobreaker.StateOpen }

// do queues op, bound for partition, and waits for its result or ctx.
// moved is true when the call was abandoned because the partition has
// another owner (or none) now: the caller should send it again to the
// current owner, with the same key.
func (c *serverClient) do(ctx context.Context, op *v1.ShardOp, partition int32) (res stock.Result, moved bool) {
	k := &call{ctx: ctx, op: op, partition: partition, done: make(chan stock.Result, 1), moved: make(chan struct{})}
	c.mu.Lock()
	c.pending[k] = struct{}{}
	c.mu.Unlock()
	defer c.forget(k)
	// The allocator chose this server from a view that a newer one may
	// have replaced before k was pending, so after abandonMoved looked:
	// look again now that k is where abandonMoved will find it.
	if c.owns(c.topo(), partition) {
		select {
		case c.queue <- k:
		default:
			return unavailable("shard server %s is overloaded", c.id), false
		}
	} else {
		c.abandon(k)
	}
	select {
	case r := <-k.done:
		return r, false
	case <-k.moved:
		return stock.Result{}, true
	case <-ctx.Done():
		return unavailable("deadline passed before shard server %s answered; retry with the same key", c.id), false
	}
}

// owns reports whether a call for partition p should wait for this server
// under view v: v names it p's live owner, or names none while the server
// is still registered. The latter is a hand-over between a release and the
// next claim, in which the old owner finishes the batches it has (Lose
// comes before the release) and its answers are worth waiting for. A
// server whose registration is gone has lost its lease: nothing it still
// answers may be waited for.
func (c *serverClient) owns(v topology.View, p int32) bool {
	if srv, _, ok := v.Owner(p); ok {
		return srv.ID == c.id && srv.Addr == c.addr
	}
	srv, ok := v.Server(c.id)
	return ok && srv.Addr == c.addr
}

// forget drops k from the pending calls once its caller stopped waiting.
func (c *serverClient) forget(k *call) {
	c.mu.Lock()
	delete(c.pending, k)
	c.mu.Unlock()
}

// abandonMoved abandons every pending call whose partition v gives to
// another server, or whose server's lease v shows gone (owns). Their
// callers stop waiting at once and send them again, with the same keys, to
// the partition's current owner (or, with none yet, a reserve or deduct
// to another shard). That is safe whether or not this server still
// applies them: a new owner bumps the partition's fence in Postgres before
// it writes, after which this server can no longer commit to it, and a key
// is recorded at most once in the database, so a retry that finds it
// recorded is a replay. An Execute call all of whose ops are abandoned is
// canceled.
func (c *serverClient) abandonMoved(v topology.View) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.pending {
		if !c.owns(v, k.partition) {
			c.abandonLocked(k)
		}
	}
}

func (c *serverClient) abandon(k *call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.abandonLocked(k)
}

func (c *serverClient) abandonLocked(k *call) {
	if k.abandoned {
		return
	}
	k.abandoned = true
	close(k.moved)
	delete(c.pending, k)
	c.metrics.abandoned.Inc()
	if f := k.flight; f != nil {
		if f.live--; f.live == 0 {
			f.cancel(errAbandoned)
		}
	}
}

// loop makes Execute calls: it takes a place among the steady calls,
// waits for an op, and sends it with whatever queued meanwhile. A call
// that runs past rpcSlotHoldMax gives its place to another loop.
func (c *serverClient) loop() {
	for {
		select {
		case c.slots <- struct{}{}:
		case <-c.stop:
			return
		}
		var first *call
		select {
		case first = <-c.queue:
		case <-c.stop:
			<-c.slots
			return
		}
		var once sync.Once
		free := func() { once.Do(func() { <-c.slots }) }
		slow := time.AfterFunc(c.holdMax, free)
		c.send(batch.Fill(first, c.queue, opsPerRPCMax))
		slow.Stop()
		free()
	}
}

// send makes one Execute call for calls, with the latest deadline among
// them (each caller stops waiting at its own).
func (c *serverClient) send(calls []*call) {
	live := calls[:0]
	var deadline time.Time
	c.mu.Lock()
	for _, k := range calls {
		if k.abandoned {
			continue // its caller has gone to the partition's new owner
		}
		if k.ctx.Err() != nil {
			k.done <- unavailable("request canceled")
			continue
		}
		live = append(live, k)
		if d, ok := k.ctx.Deadline(); !ok {
			deadline = time.Now().Add(rpcTimeoutMax)
		} else if d.After(deadline) {
			deadline = d
		}
	}
	if len(live) == 0 {
		c.mu.Unlock()
		return
	}
	if latest := time.Now().Add(rpcTimeoutMax); deadline.After(latest) {
		deadline = latest
	}
	ctx, cancelCause := context.WithCancelCause(context.Background())
	defer cancelCause(nil)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	f := &flight{cancel: cancelCause, live: len(live)}
	for _, k := range live {
		k.flight = f
	}
	c.mu.Unlock()
	req := &v1.ExecuteRequest{Ops: make([]*v1.ShardOp, len(live))}
	for i, k := range live {
		req.Ops[i] = k.op
	}
	start := time.Now()
	resp, err := c.breaker.Execute(func() (*connect.Response[v1.ExecuteResponse], error) {
		c.metrics.calls.Inc()
		resp, err := c.client.Execute(ctx, connect.NewRequest(req))
		if err != nil && connect.CodeOf(err) == connect.CodeDeadlineExceeded && time.Since(start) < breakerSlowCallMin {
			// The callers' deadline ran out almost at once: they spent
			// it elsewhere, and it says nothing of this server.
			return resp, fmt.Errorf("%w: %w", errLateCaller, err)
		}
		if err != nil && errors.Is(context.Cause(ctx), errAbandoned) {
			return resp, fmt.Errorf("%w: %w", errAbandoned, err)
		}
		return resp, err
	})
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		c.metrics.refused.Inc()
	}
	if err == nil && len(resp.Msg.GetResults()) != len(live) {
		err = errors.New("shard server answered the wrong number of results")
	}
	for i, k := range live {
		if err != nil {
			k.done <- unavailable("shard server %s: %s", c.id, wire.FromConnect(asConnect(err)).Message)
			continue
		}
		k.done <- wire.ResultFromProto(resp.Msg.GetResults()[i])
	}
}

// errLateCaller marks a call whose deadline ran out before the server could
// have answered: not a failure of the server.
var errLateCaller = errors.New("allocator: the callers' deadline had almost passed")

// errAbandoned cancels an Execute call whose every op was abandoned for its
// partition's new owner.
var errAbandoned = errors.New("allocator: abandoned for the partition's new owner")

// asConnect turns breaker errors into Connect errors.
func asConnect(err error) error {
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return err
}

func (c *serverClient) close() { close(c.stop) }

// busy reports whether a call is queued or in flight.
func (c *serverClient) busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) > 0
}

// rpcTimeoutMax bounds one Execute call.
const rpcTimeoutMax = 10 * time.Second

func unavailable(format string, args ...any) stock.Result {
	return stock.Result{Err: stock.Errorf(stock.CodeShardUnavailable, format, args...)}
}
