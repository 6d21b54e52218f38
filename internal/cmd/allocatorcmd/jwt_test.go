package allocatorcmd_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/golang-jwt/jwt/v5"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/auth/authtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/transport"
)

// jwksRefreshTest is the running allocator's -jwks-refresh here: a key
// removed from the set is refused within it.
const jwksRefreshTest = 300 * time.Millisecond

// TestRun_JWTHostile: through the running allocator, over Connect, gRPC and
// gRPC-Web, a JWT claiming the admin role with a bad signature, another
// issuer, another audience, expired, `alg: none`, HMAC-signed, or signed
// by a key not in the JWKS is refused UNAUTHENTICATED on a Replenish (which
// creates stock) and on an AdjustStock, and nothing changes. Then the JWKS
// file is rotated while the allocator runs, as a mounted Secret changes: a
// new key is taken at once, and the old one, once dropped from the set, is
// refused within -jwks-refresh.
func TestRun_JWTHostile(t *testing.T) {
	ctx := context.Background()
	old, next := authtest.NewIssuer(t, "key-old"), authtest.NewIssuer(t, "key-next")
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	publish := func(issuers ...*authtest.KeyIssuer) {
		t.Helper()
		tmp := jwks + ".tmp"
		if err := os.WriteFile(tmp, authtest.JWKS(t, issuers...), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, jwks); err != nil {
			t.Fatal(err)
		}
	}
	publish(old)
	base, _ := startOn(t, pgtest.NewMigratedDB(t), "-shard-id", "own", "-lease-ttl", "2s", "-jwks", jwks, "-jwks-refresh", jwksRefreshTest.String(),
		"-jwt-issuer", authtest.Issuer, "-jwt-audience", authtest.Audience)
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	hc := transport.NewClient()
	const sku = "jwt-hostile"
	admin := shardstockv1connect.NewAdminServiceClient(hc, base, bearer(token))
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: sku, InitialStock: 10, Shards: 1})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	entriesBefore := len(ledgerOf(t, admin, sku))

	claims := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := authtest.Claims(auth.RoleAdmin, "mallory")
		edit(c)
		return c
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, authtest.Claims(auth.RoleAdmin, "mallory")).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, authtest.Claims(auth.RoleAdmin, "mallory"))
	hs.Header["kid"] = old.KID
	hmac, err := hs.SignedString([]byte("a shared secret, guessed"))
	if err != nil {
		t.Fatal(err)
	}
	forger := authtest.NewIssuer(t, old.KID) // the set's key id, another key
	rogue := authtest.NewIssuer(t, "key-rogue")
	hostile := []struct{ name, jwt string }{
		{"BadSignature", forger.Sign(t, auth.RoleAdmin, "mallory")},
		{"OtherIssuer", old.SignClaims(t, claims(func(c jwt.MapClaims) { c["iss"] = "https://elsewhere.example" }))},
		{"OtherAudience", old.SignClaims(t, claims(func(c jwt.MapClaims) { c["aud"] = "another-api" }))},
		{"Expired", old.SignClaims(t, claims(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }))},
		{"AlgNone", none},
		{"HMACWithGuessedSecret", hmac},
		{"KeyNotInJWKS", rogue.Sign(t, auth.RoleAdmin, "mallory")},
	}
	for _, p := range protocols {
		for _, h := range hostile {
			inv := shardstockv1connect.NewInventoryServiceClient(hc, base, append(p.opts, bearer(h.jwt))...)
			_, err := inv.Replenish(ctx, connect.NewRequest(&v1.ReplenishRequest{Sku: sku, Quantity: 1_000_000, IdempotencyKey: "free-" + p.name + h.name}))
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("%s over %s: Replenish = %v, want unauthenticated", h.name, p.name, err)
			}
			adm := shardstockv1connect.NewAdminServiceClient(hc, base, append(p.opts, bearer(h.jwt))...)
			_, err = adm.AdjustStock(ctx, connect.NewRequest(&v1.AdjustStockRequest{Sku: sku, Delta: 1_000_000, Reason: "free", Approver: "mallory",
				IdempotencyKey: "adjust-" + p.name + h.name}))
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("%s over %s: AdjustStock = %v, want unauthenticated", h.name, p.name, err)
			}
		}
	}
	operator := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(token))
	st, err := operator.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: sku}))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.GetStock().GetAvailable(); got != 10 || len(ledgerOf(t, admin, sku)) != entriesBefore {
		t.Fatalf("after the hostile JWTs: %d available and %d ledger entries, want 10 and %d: a refused call changes nothing",
			got, len(ledgerOf(t, admin, sku)), entriesBefore)
	}

	// Rotation while the allocator runs.
	n := 0
	replenish := func(iss *authtest.KeyIssuer) error {
		n++
		inv := shardstockv1connect.NewInventoryServiceClient(hc, base, bearer(iss.Sign(t, auth.RoleService, "orders")))
		_, err := inv.Replenish(ctx, connect.NewRequest(&v1.ReplenishRequest{Sku: sku, Quantity: 1, IdempotencyKey: fmt.Sprintf("rotate-%d", n)}))
		return err
	}
	if err := replenish(old); err != nil {
		t.Fatalf("Replenish with the first key's JWT = %v", err)
	}
	if err := replenish(next); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Replenish with a key not yet published = %v, want unauthenticated", err)
	}
	publish(old, next)
	// The new key's id is unknown: the set is read again at once, at most
	// once a second (keyfunc's rate limit), so allow that.
	deadline := time.Now().Add(2*time.Second + jwksRefreshTest)
	for err := replenish(next); err != nil; err = replenish(next) {
		if time.Now().After(deadline) {
			t.Fatalf("Replenish with the new key's JWT = %v %s after it was published, want it taken", err, 2*time.Second+jwksRefreshTest)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := replenish(old); err != nil {
		t.Errorf("Replenish with the old key's JWT, both published = %v", err)
	}
	publish(next)
	deadline = time.Now().Add(10 * jwksRefreshTest)
	for err := replenish(old); connect.CodeOf(err) != connect.CodeUnauthenticated; err = replenish(old) {
		if time.Now().After(deadline) {
			t.Fatalf("Replenish with the dropped key's JWT = %v %s after it left the set, want unauthenticated", err, 10*jwksRefreshTest)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := replenish(next); err != nil {
		t.Errorf("Replenish with the new key's JWT after the old left = %v", err)
	}
	for _, e := range ledgerOf(t, admin, sku) {
		if strings.Contains(e.GetCaller(), "mallory") {
			t.Errorf("ledger entry %d names a hostile JWT's subject: %q", e.GetId(), e.GetCaller())
		}
	}
}
