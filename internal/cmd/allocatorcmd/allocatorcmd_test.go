package allocatorcmd_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	etcdtransport "go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/cmd/allocatorcmd"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Bounds of the start and stop of the command in a test.
const (
	startTimeout = 30 * time.Second
	// stopTimeout is rpc's shutdownTimeout (10 s) with room to spare; an
	// allocator with nothing in flight stops far sooner.
	stopTimeout = 15 * time.Second
	token       = "allocatorcmd-test-token"
	// serviceToken is the service role's: the shop's backends.
	serviceToken = "allocatorcmd-service-token"
)

// start runs the command until the test ends and returns its base URL and
// a function that stops it and returns its error, failing the test if it
// takes longer than stopTimeout.
func start(t *testing.T, extra ...string) (base string, stop func() error) {
	t.Helper()
	return startOn(t, pgtest.NewMigratedDB(t), extra...)
}

// startOn is start with url as the main database.
func startOn(t *testing.T, url string, extra ...string) (base string, stop func() error) {
	t.Helper()
	return startLogging(t, url, io.Discard, extra...)
}

// startLogging is startOn with the command's log written to stderr.
func startLogging(t *testing.T, url string, stderr io.Writer, extra ...string) (base string, stop func() error) {
	t.Helper()
	e := etcdtest.Start(t)
	args := append([]string{"-addr", "127.0.0.1:0", "-database-url", url, "-etcd-endpoints", strings.Join(e.Endpoints(), ","),
		"-admin-token", token, "-service-token", serviceToken, "-db-max-conns", "4", "-log-level", "error"}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	var stdout cmdtest.Output
	done := make(chan error, 1)
	go func() { done <- allocatorcmd.Run(ctx, args, func(string) string { return "" }, &stdout, stderr) }()
	stopped := false
	stop = func() error {
		t.Helper()
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(stopTimeout):
			t.Fatalf("Run(%v) still running %s after its context ended", args, stopTimeout)
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(startTimeout)
	for {
		for _, l := range strings.Split(stdout.String(), "\n") {
			if a, ok := strings.CutPrefix(l, "allocator listening on "); ok {
				return a, stop
			}
		}
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("Run(%v) = %v before it listened", args, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run(%v) printed no address within %s: %q", args, startTimeout, stdout.String())
		}
	}
}

// ready polls /readyz until it answers 200 or the bound passes.
func ready(base string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func adminReq[T any](msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Bearer "+token)
	return req
}

// TestRun_Allocator: the command serves the public API on 127.0.0.1:0
// until its context ends, then stops within a bound; alone it is never
// ready (no shard server), with -shard-id it runs its own and sells.
func TestRun_Allocator(t *testing.T) {
	ctx := context.Background()
	t.Run("Alone", func(t *testing.T) {
		base, stop := start(t)
		inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base)
		_, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "nosuch"}))
		if wire.Reason(err) != string(stock.CodeSKUNotFound) {
			t.Errorf("GetStock(nosuch) = %v, want SKU_NOT_FOUND", err)
		}
		admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
		if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "x", Shards: 1})); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("CreateSku without the token = %v, want unauthenticated", err)
		}
		if ready(base, 500*time.Millisecond) {
			t.Errorf("/readyz = 200 with no shard server, want not ready")
		}
		if err := stop(); err != nil {
			t.Errorf("Run after its context ended = %v, want nil", err)
		}
		if _, err := http.Get(base + "/healthz"); err == nil {
			t.Errorf("GET /healthz after Run returned succeeded, want the port closed")
		}
	})
	t.Run("WithShard", func(t *testing.T) {
		base, stop := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-cors-origins", "https://shop.example.com, https://admin.example.com")
		if !ready(base, startTimeout) {
			t.Fatalf("/readyz not 200 within %s with its own shard server", startTimeout)
		}
		// A browser on an allowed origin may call the API (CORS preflight).
		pre, _ := http.NewRequest(http.MethodOptions, base+"/shardstock.v1.InventoryService/Deduct", nil)
		pre.Header.Set("Origin", "https://admin.example.com")
		pre.Header.Set("Access-Control-Request-Method", http.MethodPost)
		pre.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
		if resp, err := http.DefaultClient.Do(pre); err != nil || resp.Header.Get("Access-Control-Allow-Origin") != "https://admin.example.com" {
			t.Errorf("CORS preflight from an allowed origin = %v, %v", resp, err)
		} else {
			resp.Body.Close()
		}
		admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
		if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: "own-sku", InitialStock: 5, Shards: 2})); err != nil {
			t.Fatalf("CreateSku = %v", err)
		}
		inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base, bearer(serviceToken))
		if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "own-sku", Quantity: 5, IdempotencyKey: "all"})); err != nil {
			t.Errorf("Deduct(5 of 5) = %v, want success", err)
		}
		if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "own-sku", Quantity: 1, IdempotencyKey: "one-more"})); wire.Reason(err) != string(stock.CodeOutOfStock) {
			t.Errorf("Deduct(1) after selling out = %v, want OUT_OF_STOCK", err)
		}
		if err := stop(); err != nil {
			t.Errorf("Run after its context ended = %v, want nil", err)
		}
	})
}

// TestRun_RateLimits: with -service-rate-limit a service credential over
// its rate gets RATE_LIMITED, a caller without one is refused before any
// limiter, and a refused call changes nothing.
func TestRun_RateLimits(t *testing.T) {
	ctx := context.Background()
	const burstN, ratePerSecond = 100, 20
	ops := cmdtest.FreeAddr(t)
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-service-rate-limit", fmt.Sprint(ratePerSecond), "-operator-addr", ops)
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: "limited", InitialStock: 1000, Shards: 2})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base)
	deduct := func(key, bearer string) error {
		req := connect.NewRequest(&v1.DeductRequest{Sku: "limited", Quantity: 1, IdempotencyKey: key})
		if bearer != "" {
			req.Header().Set("Authorization", "Bearer "+bearer)
		}
		_, err := inv.Deduct(ctx, req)
		return err
	}
	for _, bearer := range []string{"", "wrong-token-0123456789", serviceToken + "x"} {
		if err := deduct("no-token", bearer); connect.CodeOf(err) != connect.CodeUnauthenticated || wire.Reason(err) != string(stock.CodeUnauthenticated) {
			t.Errorf("Deduct with token %q = %v, want unauthenticated", bearer, err)
		}
	}
	// 100 calls at once from one credential: a bucket of 20 and 20 more a
	// second pass, the rest are RATE_LIMITED; the stock moved by exactly
	// the calls that passed. The bound counts the refill over the time the
	// burst took, however slow the machine.
	var (
		mu          sync.Mutex
		ok, limited int
		wg          sync.WaitGroup
	)
	began := time.Now()
	for i := range burstN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := deduct(fmt.Sprintf("burst-%d", i), serviceToken)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case wire.Reason(err) == string(stock.CodeRateLimited) && connect.CodeOf(err) == connect.CodeResourceExhausted:
				limited++
			default:
				t.Errorf("Deduct %d = %v", i, err)
			}
		}()
	}
	wg.Wait()
	took := time.Since(began)
	if t.Failed() {
		t.FailNow()
	}
	okMax := ratePerSecond + int(ratePerSecond*took.Seconds()) + 1
	if ok < ratePerSecond || ok > okMax || limited == 0 || ok+limited != burstN {
		t.Errorf("%d passed and %d RATE_LIMITED of %d at once in %s with -service-rate-limit %d: want %d to %d passed, the rest limited",
			ok, limited, burstN, took, ratePerSecond, ratePerSecond, okMax)
	}
	// The admin token has a bucket of its own.
	st, err := inv.GetStock(ctx, adminReq(&v1.GetStockRequest{Sku: "limited"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.Stock.GetSold(); got != int64(ok) {
		t.Errorf("sold %d after %d acknowledged deducts: refused calls must change nothing", got, ok)
	}
	// The refusals, made before any interceptor, are in the call metrics.
	resp, err := http.Get("http://" + ops + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for reason, want := range map[string]int{"RATE_LIMITED": limited, "UNAUTHENTICATED": 3, "OK": ok} {
		line := fmt.Sprintf(`shardstock_rpc_calls_total{procedure="%s",reason="%s"} %d`, shardstockv1connect.InventoryServiceDeductProcedure, reason, want)
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// TestRun_Refuses: bad configuration ends Run at once with a reason.
func TestRun_Refuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"NoDatabase", []string{"-admin-token", token}, "no database"},
		{"ShortToken", []string{"-database-url", "postgres://nowhere", "-admin-token", "short"}, "admin token"},
		{"BadFlag", []string{"-no-such-flag"}, "no-such-flag"},
		{"ShortServiceToken", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-service-token", "short"}, "service token"},
		{"PublicReplenish", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-public-calls", "Deduct,Replenish"}, "public-calls"},
		{"BadProxy", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-trusted-proxies", "10.0.0.0/8,lb"}, "trusted-proxies"},
		{"JWKSWithoutIssuer", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-jwks", "/nonexistent/jwks.json"}, "-jwt-issuer"},
		{"NegativeRate", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-rate-limit", "-1"}, "rate-limit"},
		{"NegativeClientConns", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-max-client-conns", "-1"}, "max-client-conns"},
		{"LongGroupDelay", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-group-delay", "1s"}, "-group-delay 1s: want 0 to 10ms"},
		{"OneConnection", []string{"-database-url", "postgres://nowhere", "-admin-token", token, "-db-max-conns", "1"}, "-db-max-conns 1: want 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := allocatorcmd.Run(ctx, append([]string{"-addr", "127.0.0.1:0"}, tc.args...), func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run(%v) = %v, want an error naming %q", tc.args, err, tc.want)
			}
			if ctx.Err() != nil {
				t.Errorf("Run(%v) returned only when its context ended", tc.args)
			}
		})
	}
}

// TestRun_ClientConns: with -max-client-conns 2 two clients' connections
// are served and a third client's is refused at once, counted on the
// operator's /metrics.
func TestRun_ClientConns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	ops := cmdtest.FreeAddr(t)
	base, _ := start(t, "-max-client-conns", "2", "-operator-addr", ops)
	getStock := func() error {
		inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base) // a connection of its own
		_, err := inv.GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "nosuch"}))
		return err
	}
	for i := range 2 {
		if err := getStock(); wire.Reason(err) != string(stock.CodeSKUNotFound) {
			t.Fatalf("client %d: GetStock(nosuch) = %v, want SKU_NOT_FOUND (served)", i, err)
		}
	}
	if err := getStock(); err == nil || wire.Reason(err) != "" {
		t.Errorf("a third client's GetStock = %v, want its connection refused", err)
	}
	resp, err := http.Get("http://" + ops + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{"shardstock_allocator_client_conns 2\n", "shardstock_allocator_client_conns_refused_total 1\n"} {
		if !strings.Contains(string(body), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}

// TestRun_TLS: with -tls-cert and -tls-key both listeners speak TLS only,
// HTTP/2 and HTTP/1.1 by ALPN: a Connect client (HTTP/2) and a gRPC client
// trusting the test's CA are served, and a cleartext request is not.
func TestRun_TLS(t *testing.T) {
	ctx := context.Background()
	ca := cmdtest.NewCA(t)
	certFile, keyFile := ca.Issue(t, "allocator")
	caPool := ca.Pool
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-tls-cert", certFile, "-tls-key", keyFile)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("listening on %s, want https", base)
	}
	var p http.Protocols
	p.SetHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{RootCAs: caPool}}, Timeout: 10 * time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := hc.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				if resp.ProtoMajor != 2 {
					t.Errorf("/readyz over %s, want HTTP/2", resp.Proto)
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz over TLS not 200 within %s: %v", startTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	admin := shardstockv1connect.NewAdminServiceClient(hc, base)
	if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: "tls-sku", InitialStock: 5, Shards: 1})); err != nil {
		t.Fatalf("CreateSku over TLS = %v", err)
	}
	inv := shardstockv1connect.NewInventoryServiceClient(hc, base, connect.WithGRPC(), bearer(serviceToken))
	if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "tls-sku", Quantity: 1, IdempotencyKey: "k"})); err != nil {
		t.Errorf("Deduct over gRPC and TLS = %v", err)
	}
	plain := strings.Replace(base, "https://", "http://", 1)
	if resp, err := http.Get(plain + "/readyz"); err == nil {
		if resp.StatusCode == 200 {
			t.Errorf("a cleartext /readyz was served (%d)", resp.StatusCode)
		}
		resp.Body.Close()
	}
	if _, err := (&http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{}}}).Get(base + "/readyz"); err == nil {
		t.Error("a client that does not trust the CA was served")
	}
}

// TestRun_EtcdTLS: with -etcd-ca, -etcd-cert and -etcd-key the allocator
// (and its own shard server) reach an etcd that serves TLS and requires a
// client certificate; without the certificate Run fails at start.
func TestRun_EtcdTLS(t *testing.T) {
	ca := cmdtest.NewCA(t)
	srvCert, srvKey := ca.Issue(t, "etcd")
	cliCert, cliKey := ca.Issue(t, "etcd-client")
	port, err := freeTCPPort()
	if err != nil {
		t.Fatal(err)
	}
	cu, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", port))
	pport, err := freeTCPPort()
	if err != nil {
		t.Fatal(err)
	}
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", pport))
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir, cfg.LogLevel, cfg.UnsafeNoFsync = "tls", t.TempDir(), "panic", true
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = "tls=" + pu.String()
	cfg.ClientTLSInfo = transportTLSInfo(srvCert, srvKey, ca.File)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	<-e.Server.ReadyNotify()

	base, _ := start(t, "-etcd-endpoints", cu.String(), "-etcd-ca", ca.File, "-etcd-cert", cliCert, "-etcd-key", cliKey,
		"-shard-id", "own", "-lease-ttl", "2s")
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s over etcd with TLS", startTimeout)
	}
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	if _, err := admin.CreateSku(context.Background(), adminReq(&v1.CreateSkuRequest{Sku: "etcd-tls", InitialStock: 1, Shards: 1})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	args := []string{"-addr", "127.0.0.1:0", "-database-url", pgtest.NewMigratedDB(t), "-admin-token", token, "-log-level", "error",
		"-etcd-endpoints", cu.String(), "-etcd-ca", ca.File}
	if err := allocatorcmd.Run(ctx, args, func(string) string { return "" }, io.Discard, io.Discard); err == nil {
		t.Error("Run without a client certificate for an etcd that requires one = nil error")
	}
}

// transportTLSInfo is etcd's server TLS with client certificates required.
func transportTLSInfo(cert, key, ca string) etcdtransport.TLSInfo {
	return etcdtransport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca, ClientCertAuth: true}
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
