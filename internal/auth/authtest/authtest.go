// Package authtest issues JWTs for tests: a signing key per issuer, its
// JWKS, and tokens with the claims internal/auth reads.
package authtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/shardstock/shardstock/internal/auth"
)

// The issuer and audience of the tokens a KeyIssuer signs.
const (
	Issuer   = "https://issuer.test.shardstock"
	Audience = "shardstock-api"
)

// KeyIssuer signs JWTs with one ES256 key.
type KeyIssuer struct {
	KID string
	key *ecdsa.PrivateKey
}

// NewIssuer returns an issuer with a new key named kid.
func NewIssuer(tb testing.TB, kid string) *KeyIssuer {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return &KeyIssuer{KID: kid, key: key}
}

// Claims are a token's claims for role and subject, valid for an hour.
func Claims(role auth.Role, subject string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{"iss": Issuer, "aud": Audience, "sub": subject, "role": role.String(),
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

// Sign returns a JWT of role for subject.
func (i *KeyIssuer) Sign(tb testing.TB, role auth.Role, subject string) string {
	return i.SignClaims(tb, Claims(role, subject))
}

// SignClaims returns a JWT of claims, signed with the issuer's key.
func (i *KeyIssuer) SignClaims(tb testing.TB, claims jwt.MapClaims) string {
	tb.Helper()
	t := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	t.Header["kid"] = i.KID
	s, err := t.SignedString(i.key)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// JWKS returns the JSON Web Key Set of the issuers' public keys.
func JWKS(tb testing.TB, issuers ...*KeyIssuer) []byte {
	tb.Helper()
	var set jwkset.JWKSMarshal
	for _, i := range issuers {
		jwk, err := jwkset.NewJWKFromKey(&i.key.PublicKey, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: i.KID, ALG: jwkset.AlgES256, USE: jwkset.UseSig}})
		if err != nil {
			tb.Fatal(err)
		}
		set.Keys = append(set.Keys, jwk.Marshal())
	}
	raw, err := json.Marshal(set)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// WriteJWKS writes the issuer's JWKS to a file of the test's and returns
// its path.
func (i *KeyIssuer) WriteJWKS(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "jwks.json")
	if err := os.WriteFile(path, JWKS(tb, i), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Bearer is a client option that sends credential (a token or a JWT) as
// `Authorization: Bearer`; none when it is empty.
func Bearer(credential string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if credential != "" {
				req.Header().Set("Authorization", "Bearer "+credential)
			}
			return next(ctx, req)
		}
	}))
}
