package api

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// Bounds of the limiter.
const (
	// clientsMax bounds the clients whose rate is tracked (least recently
	// seen forgotten first): about 100 bytes each.
	clientsMax = 100_000
)

// AdmitConfig configures Admit.
type AdmitConfig struct {
	// Auth tells who calls, by the Authorization header and the TLS
	// client certificate (UNAUTHENTICATED for a credential it refuses);
	// nil: every caller is auth.Anonymous.
	Auth *auth.Authenticator
	// Need is the least role a procedure needs and whether the caller
	// must be a verified customer (Policy.Need): a caller below it is
	// refused, UNAUTHENTICATED without a credential, PERMISSION_DENIED
	// with one. Nil: the public role may call all.
	Need func(procedure string) (role auth.Role, customer bool)
	// PerClient is the sustained requests per second one public client
	// may send (its burst is the same number); 0: no limit. A client is
	// its peer's IP address, or behind a trusted proxy the address
	// X-Forwarded-For names.
	PerClient float64
	// PerCredential is the same for each service or admin credential;
	// 0: no limit.
	PerCredential float64
	// TrustedProxies are the peers (load balancers, ingresses) whose
	// X-Forwarded-For header names the client; any other peer is the
	// client, whatever the header says.
	TrustedProxies []netip.Prefix
	// InFlight bounds the requests being served at once, all clients; a
	// request beyond it is refused at once. 0: no bound (and no read
	// ahead).
	InFlight int
	// BodyTimeout bounds the wait for a request's message once its headers
	// are in (with InFlight); 0: bodyTimeoutDefault.
	BodyTimeout time.Duration
	// AheadBytes bounds the bytes of messages read ahead and not yet
	// admitted, all requests together (with InFlight); a request that
	// would pass it is refused at once. 0: AheadBytesDefault.
	AheadBytes int64
}

// InFlightDefault is the allocator's default bound on InventoryService
// requests in flight (-max-in-flight), and the benchmark's Redis API's.
const InFlightDefault = 4096

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
	// AheadBytesDefault bounds the messages read ahead at once: 512
	// messages of the largest size, 32 MiB of deploy/k8s's 512 MiB
	// (honest messages are under 1 KiB and in at once).
	AheadBytesDefault = 512 * bodyAheadMax
	// connAheadShare: one connection may hold at most 1/connAheadShare
	// of the read-ahead bound (256 KiB of the default, 4 messages of the
	// largest size), so that the streams of a few connections that send
	// slowly cannot take all of it from the others.
	connAheadShare = 128
)

// Admit returns h behind admission control decided before a request's
// message is decoded: who calls and whether their role may make the call
// (UNAUTHENTICATED, PERMISSION_DENIED), and their rate (RATE_LIMITED,
// resource_exhausted: retry later with the same key) from its headers and
// peer alone; then, with its message read (up to bodyAheadMax bytes,
// within BodyTimeout, else INVALID_ARGUMENT; within the bound on bytes
// read ahead, else RATE_LIMITED), the bound on requests in flight
// (RATE_LIMITED). The message is read before the request takes a place so
// that a client that sends headers and withholds the message cannot hold
// the places of others. An admitted request's context carries its caller
// (auth.CallerOf). A refused request reaches no handler and changes
// nothing; its error is written in the request's protocol (Connect, gRPC,
// gRPC-Web) by connect's ErrorWriter, and refused(procedure, reason)
// counts it (nil: not counted).
//
// Refusing here rather than in an interceptor keeps a shed cheap: it costs
// the transport's work, a few header reads and a copy of the message, not
// the message's decoding and the handler's stack (an interceptor runs
// after both). A stranger's request costs no limiter: the credential is
// checked first. Memory is bounded: clientsMax limiters, AheadBytes read
// ahead, and InFlight requests.
func Admit(cfg AdmitConfig, h http.Handler, refused func(procedure, reason string)) http.Handler {
	var clients *lru.Cache[string, *rate.Limiter]
	var mu sync.Mutex
	if cfg.PerClient > 0 || cfg.PerCredential > 0 {
		clients, _ = lru.New[string, *rate.Limiter](clientsMax)
	}
	var slots chan struct{}
	var ahead *aheadBudget
	if cfg.InFlight > 0 {
		slots = make(chan struct{}, cfg.InFlight)
		ahead = newAheadBudget(cfg.AheadBytes)
	}
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
		badCredential = refusalOf(stock.CodeUnauthenticated, "the credential is not admitted (an unknown token, or a JWT that does not verify)")
		needs         = map[auth.Role][2]refusal{}
		noCustomer    = [2]refusal{
			refusalOf(stock.CodeUnauthenticated, "this call needs Authorization: Bearer <a JWT that names the customer>"),
			refusalOf(stock.CodePermissionDenied, "this call needs a credential that names the customer (a public JWT)"),
		}
		overRate  = refusalOf(stock.CodeRateLimited, "over the requests a second this client may send; retry later with the same key")
		full      = refusalOf(stock.CodeRateLimited, "the server is at its bound of %d requests in flight; retry later with the same key", cfg.InFlight)
		aheadFull = refusalOf(stock.CodeRateLimited, "the server is at its bound of request bytes read ahead; retry later with the same key")
		late      = refusalOf(stock.CodeInvalidArgument, "the request's message did not arrive within %s of its headers", bodyTimeout)
	)
	for _, role := range []auth.Role{auth.RoleService, auth.RoleAdmin} {
		needs[role] = [2]refusal{
			refusalOf(stock.CodeUnauthenticated, "this call needs Authorization: Bearer <a %s credential>", role),
			refusalOf(stock.CodePermissionDenied, "this call needs a %s credential", role),
		}
	}
	errs := connect.NewErrorWriter()
	refuse := func(w http.ResponseWriter, r *http.Request, f refusal) {
		if refused != nil {
			refused(r.URL.Path, f.reason)
		}
		_ = errs.Write(w, r, f.err) // a client gone is all that can fail
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller := auth.Anonymous
		if cfg.Auth != nil {
			var err error
			if caller, err = cfg.Auth.AuthenticateTLS(r.Header.Get("Authorization"), r.TLS); err != nil {
				refuse(w, r, badCredential)
				return
			}
		}
		if cfg.Need != nil {
			need, customer := cfg.Need(r.URL.Path)
			f, denied := needs[need], caller.Role < need
			if !denied && customer && caller.Role == auth.RolePublic && caller.Customer == "" {
				f, denied = noCustomer, true
			}
			if denied {
				if caller.ID == "" {
					refuse(w, r, f[0])
				} else {
					refuse(w, r, f[1])
				}
				return
			}
		}
		perSecond := cfg.PerCredential
		if caller.Role == auth.RolePublic {
			perSecond = cfg.PerClient
		}
		if clients != nil && perSecond > 0 {
			key := "credential " + caller.ID
			if caller.Role == auth.RolePublic {
				key = "client " + clientAddr(r, cfg.TrustedProxies)
			}
			mu.Lock()
			l, ok := clients.Get(key)
			if !ok {
				l = rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond)))
				clients.Add(key, l)
			}
			allowed := l.AllowN(time.Now(), 1)
			mu.Unlock()
			if !allowed {
				refuse(w, r, overRate)
				return
			}
		}
		if slots != nil {
			n := int64(bodyAheadMax)
			if r.ContentLength >= 0 && r.ContentLength < n {
				n = max(r.ContentLength, 1)
			}
			if !ahead.take(r.RemoteAddr, n) {
				refuse(w, r, aheadFull)
				return
			}
			// What was reserved but not read goes back now; what was
			// read stays counted until the handler ends.
			done, kept, err := readAhead(w, r, bodyTimeout, n)
			ahead.give(r.RemoteAddr, n-kept)
			if err != nil {
				if r.Context().Err() != nil {
					return // the client is gone: nobody to answer
				}
				refuse(w, r, late)
				return
			}
			defer func() {
				done()
				ahead.give(r.RemoteAddr, kept)
			}()
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			default:
				refuse(w, r, full)
				return
			}
		}
		if cfg.Auth != nil {
			r = r.WithContext(auth.WithCaller(r.Context(), caller))
		}
		h.ServeHTTP(w, r)
	})
}

// aheadBudget counts the bytes being read ahead, all connections and each.
type aheadBudget struct {
	mu         sync.Mutex
	total, max int64
	byConn     map[string]int64 // by peer address and port: one per connection
	byConnMax  int64
}

func newAheadBudget(limit int64) *aheadBudget {
	if limit <= 0 {
		limit = AheadBytesDefault
	}
	return &aheadBudget{max: limit, byConn: map[string]int64{}, byConnMax: max(limit/connAheadShare, bodyAheadMax)}
}

// take reserves n bytes for a read ahead on conn, if both bounds allow.
func (b *aheadBudget) take(conn string, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total+n > b.max || b.byConn[conn]+n > b.byConnMax {
		return false
	}
	b.total += n
	b.byConn[conn] += n
	return true
}

// give returns what take reserved.
func (b *aheadBudget) give(conn string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= n
	if b.byConn[conn] -= n; b.byConn[conn] <= 0 {
		delete(b.byConn, conn)
	}
}

// clientAddr is the address a request comes from: its peer's, unless the
// peer is a trusted proxy; then the last address of X-Forwarded-For that
// is not a trusted proxy (the header's earlier entries are the client's
// to write, so only what the proxies appended is believed).
func clientAddr(r *http.Request, proxies []netip.Prefix) string {
	peer := r.RemoteAddr
	if h, _, err := net.SplitHostPort(peer); err == nil {
		peer = h
	}
	if len(proxies) == 0 || !trusted(peer, proxies) {
		return peer
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		if hop == "" {
			continue
		}
		if _, err := netip.ParseAddr(hop); err != nil {
			return peer // written by no proxy of ours: the proxy is all we know
		}
		if !trusted(hop, proxies) {
			return hop
		}
	}
	return peer
}

// trusted says whether addr is in one of proxies.
func trusted(addr string, proxies []netip.Prefix) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// aheads are the buffers of readAhead.
var aheads = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readAhead reads the start of r's message (up to limit bytes) within
// timeout and puts it back in front of the rest, for the handler; kept is
// the bytes it holds, and done returns its buffer once the handler has
// ended.
//
// The timeout is a timer of its own that, only if it fires, sets a read
// deadline in the past, which ends the read at once: setting and clearing
// a deadline on every request would cost two messages to the HTTP/2
// connection's serving goroutine each (ResponseController.SetReadDeadline
// on a stream), where the timer costs nothing the connection shares.
func readAhead(w http.ResponseWriter, r *http.Request, timeout time.Duration, limit int64) (done func(), kept int64, err error) {
	ahead := aheads.Get().(*bytes.Buffer)
	done = func() {
		ahead.Reset()
		aheads.Put(ahead)
	}
	t := time.AfterFunc(timeout, func() {
		_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
	})
	_, err = ahead.ReadFrom(io.LimitReader(r.Body, limit))
	t.Stop()
	if err != nil {
		done()
		return nil, 0, err
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(ahead, r.Body), r.Body}
	return done, int64(ahead.Len()), nil
}
