package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	"io"
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
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// TokenAuth returns an interceptor that admits a call only with
// `Authorization: Bearer <token>` for one of tokens, compared in constant
// time; what names the token in the error ("API token"). A missing or
// wrong token is unauthenticated, reason UNAUTHENTICATED, and reaches no
// handler. An empty token admits nothing.
func TokenAuth(what string, tokens ...string) connect.Interceptor {
	return tokenAuth{tokens: tokens, refused: unauthenticated(what)}
}

// tokenAuth is TokenAuth's interceptor, for unary calls and streams alike
// (a connect.UnaryInterceptorFunc lets streams through unchecked).
type tokenAuth struct {
	tokens  []string
	refused error
}

// WrapUnary checks a unary call's token.
func (a tokenAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !bearerAdmitted(req.Header().Get("Authorization"), a.tokens) {
			return nil, a.refused
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient is next: the interceptor is a server's.
func (a tokenAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks a stream's token before its handler runs.
func (a tokenAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !bearerAdmitted(conn.RequestHeader().Get("Authorization"), a.tokens) {
			return a.refused
		}
		return next(ctx, conn)
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
	// BodyTimeout bounds the wait for a request's message once its headers
	// are in (with InFlight); 0: bodyTimeoutDefault.
	BodyTimeout time.Duration
}

// Bounds of Admit's read ahead.
const (
	// bodyAheadMax is the most of a message read before the request takes
	// a place in flight: the public API's message bound, so that any
	// message it accepts is in hand first.
	bodyAheadMax = transport.PublicReadMaxBytes
	// bodyTimeoutDefault: a message not in within this long of its headers
	// is refused, INVALID_ARGUMENT. A unary call's message follows its
	// headers at once; a client that withholds it holds a stream, not a
	// place in flight, and not for longer than this.
	bodyTimeoutDefault = 10 * time.Second
)

// Admit returns h behind admission control decided before a request's
// message is decoded: the token (UNAUTHENTICATED) and the client's rate
// (RATE_LIMITED, resource_exhausted: retry later with the same key) from
// its headers and peer alone; then, with its message read (up to
// bodyAheadMax bytes, within BodyTimeout, else INVALID_ARGUMENT), the
// bound on requests in flight (RATE_LIMITED). The message is read before
// the request takes a place so that a client that sends headers and
// withholds the message cannot hold the places of others. A refused
// request reaches no handler and changes nothing; its error is written in
// the request's protocol (Connect, gRPC, gRPC-Web) by connect's
// ErrorWriter, and refused(procedure, reason) counts it (nil: not
// counted).
//
// Refusing here rather than in an interceptor keeps a shed cheap: it costs
// the transport's work, a few header reads and a copy of the message, not
// the message's decoding and the handler's stack (an interceptor runs
// after both). A stranger's request costs no limiter: the token is checked
// first. Memory is bounded: clientsMax limiters and InFlight requests.
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
	bodyTimeout := cfg.BodyTimeout
	if bodyTimeout <= 0 {
		bodyTimeout = bodyTimeoutDefault
	}
	// The refusals are built once, their reasons with them: ErrorWriter
	// only reads an error, and a shed reads no detail back.
	type refusal struct {
		err    error
		reason string
	}
	refusalOf := func(code stock.Code, format string, args ...any) refusal {
		return refusal{wire.ToConnect(stock.Errorf(code, format, args...)), string(code)}
	}
	var (
		noToken  = refusal{unauthenticated(cfg.TokenName), string(stock.CodeUnauthenticated)}
		overRate = refusalOf(stock.CodeRateLimited, "over %g requests a second from this client; retry later with the same key", cfg.PerClient)
		full     = refusalOf(stock.CodeRateLimited, "the server is at its bound of %d requests in flight; retry later with the same key", cfg.InFlight)
		late     = refusalOf(stock.CodeInvalidArgument, "the request's message did not arrive within %s of its headers", bodyTimeout)
	)
	errs := connect.NewErrorWriter()
	refuse := func(w http.ResponseWriter, r *http.Request, f refusal) {
		if refused != nil {
			refused(r.URL.Path, f.reason)
		}
		_ = errs.Write(w, r, f.err) // a client gone is all that can fail
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
			done, err := readAhead(w, r, bodyTimeout)
			if err != nil {
				if r.Context().Err() != nil {
					return // the client is gone: nobody to answer
				}
				refuse(w, r, late)
				return
			}
			defer done()
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

// aheads are the buffers of readAhead.
var aheads = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readAhead reads the start of r's message (up to bodyAheadMax bytes)
// within timeout and puts it back in front of the rest, for the handler;
// done returns its buffer once the handler has ended.
//
// The timeout is a timer of its own that, only if it fires, sets a read
// deadline in the past, which ends the read at once: setting and clearing
// a deadline on every request would cost two messages to the HTTP/2
// connection's serving goroutine each (ResponseController.SetReadDeadline
// on a stream), where the timer costs nothing the connection shares.
func readAhead(w http.ResponseWriter, r *http.Request, timeout time.Duration) (done func(), err error) {
	ahead := aheads.Get().(*bytes.Buffer)
	done = func() {
		ahead.Reset()
		aheads.Put(ahead)
	}
	t := time.AfterFunc(timeout, func() {
		_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
	})
	_, err = ahead.ReadFrom(io.LimitReader(r.Body, bodyAheadMax))
	t.Stop()
	if err != nil {
		done()
		return nil, err
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(ahead, r.Body), r.Body}
	return done, nil
}
