package allocatorcmd_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/cmdtest"
)

// TestRun_ServiceClientCert: with -service-client-ca, an HTTP/2 TLS
// Connect client presenting a certificate of that CA is the service role
// (it deducts, and the ledger names it service:cert:<CN>), and no admin;
// a certificate of another CA, or none, counts as no credential: refused
// UNAUTHENTICATED and nothing changed, unless a bearer credential is sent
// too, which then names the caller.
func TestRun_ServiceClientCert(t *testing.T) {
	ctx := context.Background()
	serverCA, servicesCA, otherCA := cmdtest.NewCA(t), cmdtest.NewCA(t), cmdtest.NewCA(t)
	certFile, keyFile := serverCA.Issue(t, "allocator")
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-tls-cert", certFile, "-tls-key", keyFile,
		"-service-client-ca", servicesCA.File)
	client := func(ca *cmdtest.CA, name string) *http.Client {
		cfg := &tls.Config{RootCAs: serverCA.Pool}
		if ca != nil {
			pair, err := tls.LoadX509KeyPair(ca.Issue(t, name))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		var p http.Protocols
		p.SetHTTP2(true)
		return &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	}
	backend, stranger, none := client(servicesCA, "orders-backend"), client(otherCA, "orders-backend"), client(nil, "")
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := none.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz over TLS not 200 within %s: %v", startTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	const sku = "cert-sku"
	admin := shardstockv1connect.NewAdminServiceClient(none, base, bearer(token))
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: sku, InitialStock: 10, Shards: 1})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	deduct := func(hc *http.Client, key string, opts ...connect.ClientOption) error {
		_, err := shardstockv1connect.NewInventoryServiceClient(hc, base, opts...).
			Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: key}))
		return err
	}
	if err := deduct(backend, "by-cert"); err != nil {
		t.Fatalf("Deduct with a certificate of -service-client-ca = %v", err)
	}
	_, err := shardstockv1connect.NewAdminServiceClient(backend, base).
		ListLedger(ctx, connect.NewRequest(&v1.ListLedgerRequest{Sku: sku}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("ListLedger with a service certificate = %v, want %v", err, connect.CodePermissionDenied)
	}
	before := len(ledgerOf(t, admin, sku))
	for name, hc := range map[string]*http.Client{"another CA's certificate": stranger, "no certificate": none} {
		if err := deduct(hc, "refused"); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("Deduct with %s = %v, want %v", name, err, connect.CodeUnauthenticated)
		}
	}
	if after := len(ledgerOf(t, admin, sku)); after != before {
		t.Errorf("refused Deducts wrote %d ledger entries, want 0", after-before)
	}
	if err := deduct(stranger, "by-token", bearer(serviceToken)); err != nil {
		t.Errorf("Deduct with another CA's certificate and the service token = %v", err)
	}
	callers := map[string]string{}
	for _, e := range ledgerOf(t, admin, sku) {
		callers[e.GetIdempotencyKey()] = e.GetCaller()
	}
	for key, want := range map[string]string{"by-cert": "service:cert:orders-backend", "by-token": "service:" + auth.TokenID(serviceToken)} {
		if callers[key] != want {
			t.Errorf("ledger caller of %s = %q, want %q (all: %v)", key, callers[key], want, callers)
		}
	}
}
