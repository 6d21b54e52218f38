package api

import (
	"context"
	"crypto/subtle"
	"net"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// TokenAuth returns an interceptor that admits a call only with
// `Authorization: Bearer <token>` for one of tokens, compared in constant
// time; what names the token in the error ("API token"). A missing or
// wrong token is unauthenticated, reason UNAUTHENTICATED, and reaches no
// handler. An empty token admits nothing.
func TokenAuth(what string, tokens ...string) connect.UnaryInterceptorFunc {
	msg := "this call needs Authorization: Bearer <" + what + ">"
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			got, ok := strings.CutPrefix(req.Header().Get("Authorization"), "Bearer ")
			admitted := 0
			for _, want := range tokens {
				if want != "" {
					admitted |= subtle.ConstantTimeCompare([]byte(got), []byte(want))
				}
			}
			if !ok || admitted != 1 {
				return nil, wire.ToConnect(stock.Errorf(stock.CodeUnauthenticated, "%s", msg))
			}
			return next(ctx, req)
		}
	}
}

// Bounds of the limiter.
const (
	// clientsMax bounds the clients whose rate is tracked (least recently
	// seen forgotten first): about 100 bytes each.
	clientsMax = 100_000
)

// LimitConfig configures Limit.
type LimitConfig struct {
	// PerClient is the sustained requests per second one client may send
	// (its burst is the same number); 0: no per-client limit. A client is
	// its peer's IP address.
	PerClient float64
	// InFlight bounds the requests being served at once, all clients; a
	// request beyond it is refused at once. 0: no bound.
	InFlight int
}

// Limit returns an interceptor that sheds load before it reaches the
// service: RATE_LIMITED (resource_exhausted, retry later with the same key)
// for a client over its rate or when InFlight requests are already being
// served. A refused request changes nothing. Memory is bounded: clientsMax
// limiters and InFlight requests.
func Limit(cfg LimitConfig) connect.UnaryInterceptorFunc {
	var clients *lru.Cache[string, *rate.Limiter]
	var mu sync.Mutex
	if cfg.PerClient > 0 {
		clients, _ = lru.New[string, *rate.Limiter](clientsMax)
	}
	var slots chan struct{}
	if cfg.InFlight > 0 {
		slots = make(chan struct{}, cfg.InFlight)
	}
	burst := max(1, int(cfg.PerClient))
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if clients != nil {
				host := req.Peer().Addr
				if h, _, err := net.SplitHostPort(host); err == nil {
					host = h
				}
				mu.Lock()
				l, ok := clients.Get(host)
				if !ok {
					l = rate.NewLimiter(rate.Limit(cfg.PerClient), burst)
					clients.Add(host, l)
				}
				allowed := l.AllowN(time.Now(), 1)
				mu.Unlock()
				if !allowed {
					return nil, wire.ToConnect(stock.Errorf(stock.CodeRateLimited, "over %g requests a second from this client; retry later with the same key", cfg.PerClient))
				}
			}
			if slots != nil {
				select {
				case slots <- struct{}{}:
					defer func() { <-slots }()
				default:
					return nil, wire.ToConnect(stock.Errorf(stock.CodeRateLimited, "the server is at its bound of %d requests in flight; retry later with the same key", cfg.InFlight))
				}
			}
			return next(ctx, req)
		}
	}
}
