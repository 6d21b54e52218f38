package auth_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/auth/authtest"
)

const (
	serviceToken = "service-token-0123456789"
	adminToken   = "admin-token-0123456789"
)

// TestAuthenticate_Tokens: each role's tokens name their role and an id
// that is not the secret; an unknown or malformed credential is refused;
// no credential is the anonymous public caller.
func TestAuthenticate_Tokens(t *testing.T) {
	a, err := auth.New(t.Context(), auth.Config{AdminTokens: []string{adminToken}, ServiceTokens: []string{serviceToken, serviceToken + "-next"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		header string
		want   auth.Caller
	}{
		{"", auth.Anonymous},
		{"Bearer " + serviceToken, auth.Caller{Role: auth.RoleService, ID: auth.TokenID(serviceToken)}},
		{"Bearer " + serviceToken + "-next", auth.Caller{Role: auth.RoleService, ID: auth.TokenID(serviceToken + "-next")}},
		{"Bearer " + adminToken, auth.Caller{Role: auth.RoleAdmin, ID: auth.TokenID(adminToken)}},
	} {
		got, err := a.Authenticate(tc.header)
		if err != nil || got != tc.want {
			t.Errorf("Authenticate(%q) = %+v, %v, want %+v", tc.header, got, err, tc.want)
		}
		if strings.Contains(got.String(), strings.TrimPrefix(tc.header, "Bearer ")) && tc.header != "" {
			t.Errorf("Authenticate(%q): caller %q holds the secret", tc.header, got)
		}
	}
	for _, h := range []string{"Bearer " + serviceToken[:20], "Basic " + serviceToken, "Bearer ", serviceToken, "Bearer a.b.c"} {
		if got, err := a.Authenticate(h); !errors.Is(err, auth.ErrRefused) {
			t.Errorf("Authenticate(%q) = %+v, %v, want ErrRefused", h, got, err)
		}
	}
	if _, err := auth.New(t.Context(), auth.Config{ServiceTokens: []string{"short"}}); err == nil {
		t.Errorf("New with a 5-character token: nil error")
	}
}

// TestAuthenticate_JWT: a JWT signed by a key of the JWKS, of the issuer
// and audience, unexpired, names its role and subject (the customer for
// the public role); every hostile one is refused.
func TestAuthenticate_JWT(t *testing.T) {
	iss := authtest.NewIssuer(t, "key-1")
	a, err := auth.New(t.Context(), auth.Config{JWKS: iss.WriteJWKS(t), Issuer: authtest.Issuer, Audience: authtest.Audience})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		role auth.Role
		want auth.Caller
	}{
		{auth.RolePublic, auth.Caller{Role: auth.RolePublic, ID: "jwt:alice", Customer: "alice"}},
		{auth.RoleService, auth.Caller{Role: auth.RoleService, ID: "jwt:alice"}},
		{auth.RoleAdmin, auth.Caller{Role: auth.RoleAdmin, ID: "jwt:alice"}},
	} {
		got, err := a.Authenticate("Bearer " + iss.Sign(t, tc.role, "alice"))
		if err != nil || got != tc.want {
			t.Errorf("Authenticate(%s JWT) = %+v, %v, want %+v", tc.role, got, err, tc.want)
		}
	}

	other := authtest.NewIssuer(t, "key-1") // the same key id, another key
	rogue := authtest.NewIssuer(t, "key-rogue")
	claims := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := authtest.Claims(auth.RoleService, "alice")
		edit(c)
		return c
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, authtest.Claims(auth.RoleAdmin, "alice")).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, authtest.Claims(auth.RoleAdmin, "alice"))
	hs.Header["kid"] = "key-1"
	hmac, err := hs.SignedString([]byte("a shared secret, guessed"))
	if err != nil {
		t.Fatal(err)
	}
	good := iss.Sign(t, auth.RoleAdmin, "alice")
	parts := strings.Split(good, ".")
	for _, tc := range []struct{ name, jwt string }{
		{"BadSignature", other.Sign(t, auth.RoleAdmin, "alice")},
		{"TamperedClaims", parts[0] + "." + strings.Split(iss.Sign(t, auth.RoleAdmin, "mallory"), ".")[1] + "." + parts[2]},
		{"OtherIssuer", iss.SignClaims(t, claims(func(c jwt.MapClaims) { c["iss"] = "https://elsewhere.example" }))},
		{"OtherAudience", iss.SignClaims(t, claims(func(c jwt.MapClaims) { c["aud"] = "another-api" }))},
		{"Expired", iss.SignClaims(t, claims(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }))},
		{"NoExpiry", iss.SignClaims(t, claims(func(c jwt.MapClaims) { delete(c, "exp") }))},
		{"NotYetValid", iss.SignClaims(t, claims(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() }))},
		{"AlgNone", none},
		{"HMACWithGuessedSecret", hmac},
		{"KeyNotInJWKS", rogue.Sign(t, auth.RoleAdmin, "alice")},
		{"UnknownRole", iss.SignClaims(t, claims(func(c jwt.MapClaims) { c["role"] = "root" }))},
		{"NoSubject", iss.SignClaims(t, claims(func(c jwt.MapClaims) { delete(c, "sub") }))},
		{"Garbage", "eyJhbGciOi.eyJzdWIiOi.c2ln"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := a.Authenticate("Bearer " + tc.jwt); !errors.Is(err, auth.ErrRefused) {
				t.Errorf("Authenticate = %+v, %v, want ErrRefused", got, err)
			}
		})
	}
}

// TestAuthenticate_JWKSRotated: a JWKS that changes while the process
// runs is read again, from a file and from a URL: a new key is taken at
// once (its unknown id reads the set again), a removed one is refused
// after the next refresh.
func TestAuthenticate_JWKSRotated(t *testing.T) {
	old, next := authtest.NewIssuer(t, "key-old"), authtest.NewIssuer(t, "key-next")
	var served atomic.Pointer[[]byte]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(*served.Load()) }))
	t.Cleanup(srv.Close)
	file := old.WriteJWKS(t)
	for _, tc := range []struct {
		name, source string
		publish      func(jwks []byte)
	}{
		{"File", file, func(jwks []byte) {
			// Written aside and renamed in, as a mounted Secret changes.
			tmp := file + ".tmp"
			if err := os.WriteFile(tmp, jwks, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, file); err != nil {
				t.Fatal(err)
			}
		}},
		{"URL", srv.URL, func(jwks []byte) { served.Store(&jwks) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.publish(authtest.JWKS(t, old))
			const refresh = 200 * time.Millisecond
			a, err := auth.New(t.Context(), auth.Config{JWKS: tc.source, Issuer: authtest.Issuer, Audience: authtest.Audience, Refresh: refresh})
			if err != nil {
				t.Fatal(err)
			}
			expect := func(iss *authtest.KeyIssuer, admitted bool) {
				t.Helper()
				_, err := a.Authenticate("Bearer " + iss.Sign(t, auth.RoleService, "orders"))
				if (err == nil) != admitted {
					t.Errorf("Authenticate(JWT of %s) = %v, want admitted %v", iss.KID, err, admitted)
				}
			}
			expect(old, true)
			tc.publish(authtest.JWKS(t, old, next))
			expect(next, true) // at once: its id is unknown, the set is read again
			tc.publish(authtest.JWKS(t, next))
			time.Sleep(3 * refresh)
			expect(old, false)
			expect(next, true)
		})
	}
}

// TestNew_JWKSRefused: a JWKS that cannot be read or parsed, or one
// without an issuer and an audience, stops the start.
func TestNew_JWKSRefused(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(bad, []byte(`{"keys":`), 0o600); err != nil {
		t.Fatal(err)
	}
	good := authtest.NewIssuer(t, "k").WriteJWKS(t)
	for _, cfg := range []auth.Config{
		{JWKS: filepath.Join(t.TempDir(), "missing.json"), Issuer: authtest.Issuer, Audience: authtest.Audience},
		{JWKS: bad, Issuer: authtest.Issuer, Audience: authtest.Audience},
		{JWKS: good, Audience: authtest.Audience},
		{JWKS: good, Issuer: authtest.Issuer},
	} {
		if _, err := auth.New(context.Background(), cfg); err == nil {
			t.Errorf("New(%+v): nil error", cfg)
		}
	}
}
