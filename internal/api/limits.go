package api

import (
	"context"
	"crypto/subtle"
	"net"
	"net/http"
	"slices"
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
	refused := unauthenticated(what)
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if !bearerAdmitted(req.Header().Get("Authorization"), tokens) {
				return nil, refused
			}
			return next(ctx, req)
		}
	}
}

// bearerAdmitted says whether an Authorization header value is
// `Bearer <token>` for one of tokens (never an empty one), comparing every
// token in constant time.
func bearerAdmitted(header string, tokens []string) bool {
	got, ok := strings.CutPrefix(header, "Bearer ")
	admitted := 0
	for _, want := range tokens {
		if want != "" {
			admitted |= subtle.ConstantTimeCompare([]byte(got), []byte(want))
		}
	}
	return ok && admitted == 1
}

// unauthenticated is the error of a call without the token what names.
func unauthenticated(what string) error {
	return wire.ToConnect(stock.Errorf(stock.CodeUnauthenticated, "this call needs Authorization: Bearer <%s>", what))
}

// Bounds of the limiter.
const (
	// clientsMax bounds the clients whose rate is tracked (least recently
	// seen forgotten first): about 100 bytes each.
	clientsMax = 100_000
)

// AdmitConfig configures Admit.
type AdmitConfig struct {
	// Tokens, if any is not empty: a request needs `Authorization: Bearer
	// <token>` for one of them (TokenAuth's rule); TokenName names the
	// token in the error ("API token").
	Tokens    []string
	TokenName string
	// PerClient is the sustained requests per second one client may send
	// (its burst is the same number); 0: no per-client limit. A client is
	// its peer's IP address.
	PerClient float64
	// InFlight bounds the requests being served at once, all clients; a
	// request beyond it is refused at once. 0: no bound.
	InFlight int
}

// Admit returns h behind admission control decided from a request's
// headers and peer alone, before its body is read or decoded: the token
// (UNAUTHENTICATED), then the client's rate and the bound on requests in
// flight (RATE_LIMITED, resource_exhausted: retry later with the same
// key). A refused request reaches no handler and changes nothing; its
// error is written in the request's protocol (Connect, gRPC, gRPC-Web) by
// connect's ErrorWriter, and refused(procedure, reason) counts it (nil:
// not counted).
//
// Refusing here rather than in an interceptor is what keeps a shed cheap:
// under a burst beyond what the server can serve, a refusal costs the
// transport's work and three header reads, not the message's decoding and
// the handler's stack (an interceptor runs after both), so the server
// keeps answering every request promptly, if only to refuse it, at rates
// far above its peak. A stranger's request costs no limiter: the token is
// checked first. Memory is bounded: clientsMax limiters and InFlight
// requests.
func Admit(cfg AdmitConfig, h http.Handler, refused func(procedure, reason string)) http.Handler {
	tokens := slices.DeleteFunc(slices.Clone(cfg.Tokens), func(s string) bool { return s == "" })
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
	// The errors are built once: ErrorWriter only reads them.
	var (
		noToken  = unauthenticated(cfg.TokenName)
		overRate = wire.ToConnect(stock.Errorf(stock.CodeRateLimited, "over %g requests a second from this client; retry later with the same key", cfg.PerClient))
		full     = wire.ToConnect(stock.Errorf(stock.CodeRateLimited, "the server is at its bound of %d requests in flight; retry later with the same key", cfg.InFlight))
	)
	errs := connect.NewErrorWriter()
	refuse := func(w http.ResponseWriter, r *http.Request, err error) {
		if refused != nil {
			refused(r.URL.Path, wire.Reason(err))
		}
		_ = errs.Write(w, r, err) // a client gone is all that can fail
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(tokens) > 0 && !bearerAdmitted(r.Header.Get("Authorization"), tokens) {
			refuse(w, r, noToken)
			return
		}
		if clients != nil {
			host := r.RemoteAddr
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
				refuse(w, r, overRate)
				return
			}
		}
		if slots != nil {
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			default:
				refuse(w, r, full)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
