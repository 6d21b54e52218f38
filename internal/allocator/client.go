package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/sony/gobreaker/v2"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/batch"
	"github.com/shardstock/shardstock/internal/rpc"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of a shard-server client.
const (
	// rpcsInFlightMax: each server gets this many Execute calls at once;
	// what queues meanwhile rides the next call (smart batching again).
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
	ctx  context.Context
	op   *v1.ShardOp
	done chan stock.Result // buffered 1
}

// serverClient talks to one shard server: it coalesces the ops bound for
// it into Execute calls and trips a circuit breaker when it fails.
type serverClient struct {
	id, addr string
	client   shardstockv1connect.ShardServiceClient
	breaker  *gobreaker.CircuitBreaker[*connect.Response[v1.ExecuteResponse]]
	queue    chan *call
	stop     chan struct{}
}

func newServerClient(id, addr string, hc *http.Client, onState func(id string, to gobreaker.State)) *serverClient {
	c := &serverClient{
		id:     id,
		addr:   addr,
		client: shardstockv1connect.NewShardServiceClient(hc, "http://"+addr, rpc.InternalClientOptions()...),
		queue:  make(chan *call, clientQueueLenMax),
		stop:   make(chan struct{}),
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
	})
	for range rpcsInFlightMax {
		go c.loop()
	}
	return c
}

// open reports whether the breaker refuses calls now.
func (c *serverClient) open() bool { return c.breaker.State() == gobreaker.StateOpen }

// do queues op and waits for its result or ctx.
func (c *serverClient) do(ctx context.Context, op *v1.ShardOp) stock.Result {
	k := &call{ctx: ctx, op: op, done: make(chan stock.Result, 1)}
	select {
	case c.queue <- k:
	default:
		return unavailable("shard server %s is overloaded", c.id)
	}
	select {
	case r := <-k.done:
		return r
	case <-ctx.Done():
		return unavailable("deadline passed before shard server %s answered; retry with the same key", c.id)
	}
}

func (c *serverClient) loop() {
	for {
		var first *call
		select {
		case first = <-c.queue:
		case <-c.stop:
			return
		}
		c.send(batch.Fill(first, c.queue, opsPerRPCMax))
	}
}

// send makes one Execute call for calls, with the latest deadline among
// them (each caller stops waiting at its own).
func (c *serverClient) send(calls []*call) {
	live := calls[:0]
	var deadline time.Time
	for _, k := range calls {
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
		return
	}
	if latest := time.Now().Add(rpcTimeoutMax); deadline.After(latest) {
		deadline = latest
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	req := &v1.ExecuteRequest{Ops: make([]*v1.ShardOp, len(live))}
	for i, k := range live {
		req.Ops[i] = k.op
	}
	start := time.Now()
	resp, err := c.breaker.Execute(func() (*connect.Response[v1.ExecuteResponse], error) {
		resp, err := c.client.Execute(ctx, connect.NewRequest(req))
		if err != nil && connect.CodeOf(err) == connect.CodeDeadlineExceeded && time.Since(start) < breakerSlowCallMin {
			// The callers' deadline ran out almost at once: they spent
			// it elsewhere, and it says nothing of this server.
			return resp, fmt.Errorf("%w: %w", errLateCaller, err)
		}
		return resp, err
	})
	if err == nil && len(resp.Msg.GetResults()) != len(live) {
		err = errors.New("shard server answered the wrong number of results")
	}
	for i, k := range live {
		if err != nil {
			k.done <- unavailable("shard server %s: %s", c.id, rpc.FromConnect(asConnect(err)).Message)
			continue
		}
		k.done <- rpc.ResultFromProto(resp.Msg.GetResults()[i])
	}
}

// errLateCaller marks a call whose deadline ran out before the server could
// have answered: not a failure of the server.
var errLateCaller = errors.New("allocator: the callers' deadline had almost passed")

// asConnect turns breaker errors into Connect errors.
func asConnect(err error) error {
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return err
}

func (c *serverClient) close() { close(c.stop) }

// rpcTimeoutMax bounds one Execute call.
const rpcTimeoutMax = 10 * time.Second

func unavailable(format string, args ...any) stock.Result {
	return stock.Result{Err: stock.Errorf(stock.CodeShardUnavailable, format, args...)}
}
