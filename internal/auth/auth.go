// Package auth tells who calls: it turns an Authorization header into a
// Caller (a role, the id of the credential, and for the public role the
// verified customer), from bearer tokens configured per role or from JWTs
// verified against a JWKS that it re-reads while running; a TLS client
// certificate of a configured CA names a service.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Role is what a caller may do; each role may do what the roles below it
// may.
type Role int8

const (
	// RolePublic: browsers and apps, and every caller without a
	// credential: reads a shop shows, nothing that changes stock (unless
	// the deployment opts a call in).
	RolePublic Role = iota
	// RoleService: the shop's backends: every call of the
	// InventoryService.
	RoleService
	// RoleAdmin: operators: the AdminService, and all a service may do.
	RoleAdmin
)

var roleNames = map[Role]string{RolePublic: "public", RoleService: "service", RoleAdmin: "admin"}

// String is the role's name, as a JWT's role claim gives it.
func (r Role) String() string { return roleNames[r] }

// parseRole reads a role claim.
func parseRole(s string) (Role, bool) {
	for r, name := range roleNames {
		if name == s {
			return r, true
		}
	}
	return 0, false
}

// Caller is who made a call.
type Caller struct {
	Role Role
	// ID names the credential, never its secret: "token:" and the first
	// 12 hex digits of the token's SHA-256, "jwt:" and the JWT's subject,
	// or "cert:" and a client certificate's name (CertID); empty for a
	// call without a credential.
	ID string
	// Customer is the verified customer of a public JWT (its subject);
	// empty otherwise.
	Customer string
}

// Anonymous is the caller of a call without a credential.
var Anonymous = Caller{Role: RolePublic}

// String names the caller for the ledger and the log: the role, then the
// credential's id ("service:token:3f2a9c1b0d4e", "admin:jwt:alice"); the
// role alone without a credential.
func (c Caller) String() string {
	if c.ID == "" {
		return c.Role.String()
	}
	return c.Role.String() + ":" + c.ID
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller ctx carries, else Anonymous.
func CallerOf(ctx context.Context) Caller {
	if c, ok := CallerFrom(ctx); ok {
		return c
	}
	return Anonymous
}

// CallerFrom returns the caller ctx carries, if it carries one: a call
// that went through no authentication (a process that serves no
// strangers) carries none.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Bounds of credentials.
const (
	// TokenLenMin keeps guessable bearer tokens out.
	TokenLenMin = 16
	// subjectLenMax bounds a JWT's subject, which names the caller in
	// the ledger and may be a customer reference (stock.RefLenMax).
	subjectLenMax = 128
	// jwtLenMax bounds a bearer JWT: a few claims and an RSA-4096
	// signature take under 2 KB.
	jwtLenMax = 8 << 10
	// leeway is the clock skew allowed on exp, nbf and iat.
	leeway = 30 * time.Second
)

// signingMethods are the JWT algorithms accepted: public-key ones only,
// so that neither "none" nor an HMAC keyed with a public key can pass.
var signingMethods = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// Config configures an Authenticator.
type Config struct {
	// Bearer tokens of each role: several each, so that one can be
	// rotated in while the last is still in use. Each at least
	// TokenLenMin characters.
	AdminTokens, ServiceTokens, PublicTokens []string
	// JWKS is a file or an http(s) URL of the JSON Web Key Set that signs
	// JWTs; empty: no JWTs. Issuer and Audience are then required: a JWT
	// must name both.
	JWKS, Issuer, Audience string
	// Refresh is how often the JWKS is read again (and at most once a
	// second more, for a key id it does not know); 0: RefreshDefault.
	Refresh time.Duration
	// Client fetches a JWKS URL; nil: a client with a 10 s timeout.
	Client *http.Client
	// ClientCAs returns the current pool of the CAs whose client
	// certificates name a service (AuthenticateTLS); nil: certificates
	// name nobody.
	ClientCAs func() *x509.CertPool
	Logger    *slog.Logger
}

// ErrRefused is the error of a credential that is not admitted.
var ErrRefused = errors.New("auth: credential refused")

// token is one configured bearer token.
type token struct {
	secret []byte
	caller Caller
}

// Authenticator tells who calls.
type Authenticator struct {
	tokens []token
	keys   *keySet // nil without a JWKS
	parser *jwt.Parser
	certs  *certs // nil without client CAs
}

// New builds an Authenticator. With a JWKS, it reads it once (an error if
// it cannot) and again every cfg.Refresh until ctx ends.
func New(ctx context.Context, cfg Config) (*Authenticator, error) {
	a := &Authenticator{}
	if cfg.ClientCAs != nil {
		a.certs = newCerts(cfg.ClientCAs)
	}
	for _, set := range []struct {
		role   Role
		tokens []string
	}{{RoleAdmin, cfg.AdminTokens}, {RoleService, cfg.ServiceTokens}, {RolePublic, cfg.PublicTokens}} {
		for _, t := range set.tokens {
			if len(t) < TokenLenMin {
				return nil, fmt.Errorf("auth: a %s token must be at least %d characters", set.role, TokenLenMin)
			}
			a.tokens = append(a.tokens, token{secret: []byte(t), caller: Caller{Role: set.role, ID: TokenID(t)}})
		}
	}
	if cfg.JWKS == "" {
		return a, nil
	}
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("auth: a JWKS needs an issuer and an audience")
	}
	keys, err := newKeySet(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a.keys = keys
	a.parser = jwt.NewParser(jwt.WithValidMethods(signingMethods), jwt.WithIssuer(cfg.Issuer), jwt.WithAudience(cfg.Audience),
		jwt.WithExpirationRequired(), jwt.WithLeeway(leeway))
	return a, nil
}

// TokenID is the id of a bearer token in the ledger and the log: what an
// operator computes with `printf %s "$TOKEN" | sha256sum | cut -c1-12`.
func TokenID(t string) string {
	sum := sha256.Sum256([]byte(t))
	return "token:" + hex.EncodeToString(sum[:6])
}

// Authenticate returns the caller an Authorization header names: Anonymous
// without one; ErrRefused (wrapped, with why) for a credential that is
// not admitted: an unknown token, a JWT that does not verify.
func (a *Authenticator) Authenticate(header string) (Caller, error) {
	if header == "" {
		return Anonymous, nil
	}
	bearer, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || bearer == "" {
		return Caller{}, fmt.Errorf("%w: not a bearer credential", ErrRefused)
	}
	// Every token is compared, in constant time, so that the time taken
	// tells nothing of which came close.
	found := -1
	for i, t := range a.tokens {
		if subtle.ConstantTimeCompare([]byte(bearer), t.secret) == 1 {
			found = i
		}
	}
	if found >= 0 {
		return a.tokens[found].caller, nil
	}
	if a.keys == nil || strings.Count(bearer, ".") != 2 {
		return Caller{}, fmt.Errorf("%w: unknown token", ErrRefused)
	}
	return a.verify(bearer)
}

// AuthenticateTLS is Authenticate for a request over a TLS connection
// (state; nil for cleartext) whose client certificate, if the configured
// client CAs verify it, names a service caller (CertID). With both a
// certificate and an Authorization header, the higher role of the two
// calls, the header's on a tie; a header that is not admitted is refused
// whatever the certificate. A certificate that does not verify (another
// CA, expired, not for client authentication) counts as none.
func (a *Authenticator) AuthenticateTLS(header string, state *tls.ConnectionState) (Caller, error) {
	caller, err := a.Authenticate(header)
	if err != nil || a.certs == nil || caller.Role >= RoleService {
		return caller, err
	}
	if c, ok := a.certs.caller(state); ok {
		return c, nil
	}
	return caller, nil
}

// claims are the JWT claims read.
type claims struct {
	jwt.RegisteredClaims
	Role string `json:"role"`
}

// verify checks a JWT: signed by a key of the JWKS with a public-key
// algorithm, of the configured issuer and audience, unexpired, with a
// subject and a role.
func (a *Authenticator) verify(s string) (Caller, error) {
	if len(s) > jwtLenMax {
		return Caller{}, fmt.Errorf("%w: JWT longer than %d bytes", ErrRefused, jwtLenMax)
	}
	var c claims
	if _, err := a.parser.ParseWithClaims(s, &c, a.keys.keyfunc); err != nil {
		return Caller{}, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	role, ok := parseRole(c.Role)
	if !ok {
		return Caller{}, fmt.Errorf("%w: JWT role claim %q is not public, service or admin", ErrRefused, c.Role)
	}
	if c.Subject == "" || !printable(c.Subject) {
		return Caller{}, fmt.Errorf("%w: JWT subject empty, longer than %d or not printable", ErrRefused, subjectLenMax)
	}
	caller := Caller{Role: role, ID: "jwt:" + c.Subject}
	if role == RolePublic {
		caller.Customer = c.Subject
	}
	return caller, nil
}
