package baseline_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/shardstock/shardstock/bench/internal/baseline"
	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/transport"
)

const redisAddr = "127.0.0.1:6379"

func TestMain(m *testing.M) { pgtest.Main(m) }

type newTarget func(t *testing.T) loadgen.Target

func postgres(ctor func(baseline.PostgresConfig) *baseline.Postgres) newTarget {
	return func(t *testing.T) loadgen.Target {
		return ctor(baseline.PostgresConfig{DatabaseURL: pgtest.NewDB(t), MaxConns: 16})
	}
}

func redisTarget(fsync bool) newTarget {
	return func(t *testing.T) loadgen.Target {
		return baseline.NewRedis(baseline.RedisConfig{Addr: redisAddr, Fsync: fsync})
	}
}

var targets = []struct {
	name string
	new  newTarget
	// exact baselines must keep every rule; naive is reported as it is.
	exact bool
}{
	{"naive", postgres(baseline.NewNaive), false},
	{"onerow", postgres(baseline.NewOneRow), true},
	{"subrows", postgres(baseline.NewSubRows), true},
	{"redis", redisTarget(false), true},
	{"redis-fsync", redisTarget(true), true},
	{"redis-api", redisAPITarget(true), true},
	{"redis-api-bare", redisAPITarget(false), true},
}

// Tokens of the redis-api target's front in these tests.
const (
	testAdminToken   = "test-admin-token-0123456789"
	testServiceToken = "test-service-token-0123456789"
)

// redisAPITarget serves baseline.RedisAPI in this process, behind the
// allocator's front (front) or not, and drives it with the shardstock
// client, as the load generator's redis-api and redis-api-bare targets do
// in a process of their own; its keys are deleted at cleanup.
func redisAPITarget(front bool) newTarget {
	return func(t *testing.T) loadgen.Target {
		cfg := serveRedisAPI(t, front)
		return shardstock.New(cfg)
	}
}

// serveRedisAPI serves a RedisAPI until the test ends and returns the
// client's settings: its address, and with the front the tokens.
func serveRedisAPI(t *testing.T, front bool) shardstock.Config {
	t.Helper()
	ctx := context.Background()
	prefix := fmt.Sprintf("test:redis-api:%d:", time.Now().UnixNano())
	cfg := baseline.RedisAPIConfig{Addr: redisAddr, Prefix: prefix}
	if front {
		cfg.AdminToken, cfg.ServiceToken = testAdminToken, testServiceToken
	}
	s, err := baseline.NewRedisAPI(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- transport.Serve(sctx, l, s.Handler()) }()
	t.Cleanup(func() {
		cancel()
		<-done
		s.Close()
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Unlink(ctx, iter.Val())
		}
	})
	return shardstock.Config{Addr: "http://" + l.Addr().String(), AdminToken: cfg.AdminToken, ServiceToken: cfg.ServiceToken}
}

// TestRedisAPI_Front: behind the front, the Redis API asks of its callers
// what the allocator does: a call without a credential, or with an unknown
// one, is refused UNAUTHENTICATED; the service role may not call the
// AdminService (PERMISSION_DENIED); the service token deducts, and the
// admin token administers. Without the front, an anonymous deduct is
// served: redis-api-bare measures an API that checks no caller.
func TestRedisAPI_Front(t *testing.T) {
	ctx := context.Background()
	cfg := serveRedisAPI(t, true)
	hc := transport.NewClient()
	with := func(token string) connect.ClientOption {
		return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				if token != "" {
					req.Header().Set("Authorization", "Bearer "+token)
				}
				return next(ctx, req)
			}
		}))
	}
	admin := shardstockv1connect.NewAdminServiceClient(hc, cfg.Addr, with(testAdminToken))
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "front", InitialStock: 10, Shards: 1})); err != nil {
		t.Fatalf("CreateSku with the admin token = %v", err)
	}
	deduct := func(token, key string) error {
		inv := shardstockv1connect.NewInventoryServiceClient(hc, cfg.Addr, with(token))
		_, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "front", Quantity: 1, IdempotencyKey: key}))
		return err
	}
	for _, tc := range []struct {
		token string
		want  connect.Code
	}{{"", connect.CodeUnauthenticated}, {"not-a-token-of-this-server", connect.CodeUnauthenticated}} {
		if err := deduct(tc.token, "refused-"+tc.token); connect.CodeOf(err) != tc.want {
			t.Errorf("Deduct with token %q = %v, want %v", tc.token, err, tc.want)
		}
	}
	asService := shardstockv1connect.NewAdminServiceClient(hc, cfg.Addr, with(testServiceToken))
	if _, err := asService.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "front2", InitialStock: 1, Shards: 1})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("CreateSku with the service token = %v, want permission_denied", err)
	}
	if err := deduct(testServiceToken, "served"); err != nil {
		t.Errorf("Deduct with the service token = %v", err)
	}
	st, err := shardstockv1connect.NewInventoryServiceClient(hc, cfg.Addr, with(testServiceToken)).GetStock(ctx, connect.NewRequest(&v1.GetStockRequest{Sku: "front"}))
	if err != nil || st.Msg.GetStock().GetSold() != 1 {
		t.Errorf("GetStock(front) = %v, %v; want 1 sold: the refused calls changed nothing", st, err)
	}

	bare := serveRedisAPI(t, false)
	badmin := shardstockv1connect.NewAdminServiceClient(hc, bare.Addr)
	if _, err := badmin.CreateSku(ctx, connect.NewRequest(&v1.CreateSkuRequest{Sku: "bare", InitialStock: 1, Shards: 1})); err != nil {
		t.Fatalf("CreateSku without the front, anonymous = %v", err)
	}
	binv := shardstockv1connect.NewInventoryServiceClient(hc, bare.Addr)
	if _, err := binv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "bare", Quantity: 1, IdempotencyKey: "anon"})); err != nil {
		t.Errorf("Deduct without the front, anonymous = %v, want served", err)
	}
}

// run drives target with cfg (bounded by count and by time) and closes it.
func run(t *testing.T, target loadgen.Target, cfg loadgen.Config) *loadgen.Result {
	t.Helper()
	if cfg.Duration == 0 {
		cfg.Duration = 10 * time.Second
	}
	r, err := loadgen.NewRunner(cfg)
	if err != nil {
		t.Fatalf("NewRunner(%+v) = %v", cfg, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	res, err := r.Run(ctx, target)
	if cerr := target.Close(); cerr != nil {
		t.Errorf("Close() = %v", cerr)
	}
	if err != nil {
		t.Fatalf("Run(%s) = %v", target.Name(), err)
	}
	return res
}

func table(t *testing.T, res *loadgen.Result) string {
	t.Helper()
	var b bytes.Buffer
	if err := loadgen.WriteTable(&b, []*loadgen.Result{res}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestBaselines_Case runs the source document's case (100 units, 500
// deducts of 1, 50 reusing a key) on every baseline.
func TestBaselines_Case(t *testing.T) {
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			target := tc.new(t)
			res := run(t, target, loadgen.Config{Model: loadgen.ModelCase, Concurrency: 64, Shards: 4})
			out := table(t, res)
			t.Logf("\n%s", out)
			c := res.Correctness
			if res.Requests != 500 || res.OK+res.Replayed+res.OutOfStock+res.Errors != 500 {
				t.Errorf("requests %d (ok %d, replayed %d, oos %d, errors %d), want 500", res.Requests, res.OK, res.Replayed, res.OutOfStock, res.Errors)
			}
			if res.Failed() {
				t.Errorf("a baseline failed the run; it must be reported as it is")
			}
			st := res.State.SKUs[res.SKUs[0].SKU]
			if !tc.exact {
				// Naive may oversell and duplicate; the report must say what it did.
				if want := max(0, res.OK-100); c.Oversold < want {
					t.Errorf("naive: %d successes of 100 units, oversold %d, want >= %d", res.OK, c.Oversold, want)
				}
				if st.Sold != res.OK || st.Ledger["deduct"] != res.OK {
					t.Errorf("naive: state %+v, want sold and %d deduct entries = %d successes", st, st.Ledger["deduct"], res.OK)
				}
				if !c.Clean() && !strings.Contains(out, "reported") {
					t.Errorf("naive: correctness %+v not zero but the table does not say it is reported:\n%s", c, out)
				}
				if c.Oversold > 0 && !strings.Contains(out, fmt.Sprintf("oversold %d", c.Oversold)) {
					t.Errorf("naive: the table does not report oversold %d:\n%s", c.Oversold, out)
				}
				return
			}
			if res.OK != 100 || c.Oversold != 0 || c.Duplicates != 0 || !c.Clean() {
				t.Errorf("successes %d, correctness %+v, want 100 successes and all zero", res.OK, c)
			}
			if res.Errors != 0 {
				t.Errorf("errors %v, want none", res.ErrorsByCode)
			}
			if st.Available != 0 || st.Sold != 100 || st.Ledger["deduct"] != 100 || st.DistinctKeys != 100 || st.Operations != 100 {
				t.Errorf("state %+v, want available 0, sold 100, 100 deduct entries of 100 keys", st)
			}
		})
	}
}

// TestBaselines_Faults runs reserve/commit/release flows with duplicate
// submissions and abandoned requests on every baseline.
func TestBaselines_Faults(t *testing.T) {
	cfg := loadgen.Config{
		Model: loadgen.ModelB, SKUs: 10, Stock: 60, Shards: 3, Requests: 1200, Concurrency: 16,
		Mix: loadgen.Mix{Deduct: 2, Commit: 1, Release: 1}, Qty: loadgen.QtyDist{Min: 1, Max: 1},
		DupRate: 0.2, AbandonRate: 0.2,
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, tc.new(t), cfg)
			t.Logf("\n%s", table(t, res))
			for _, op := range []string{"deduct", "reserve", "commit", "release"} {
				if res.RequestsByOp[op] == 0 {
					t.Errorf("no %s request (%v)", op, res.RequestsByOp)
				}
			}
			if res.OutOfStock == 0 {
				t.Errorf("no out-of-stock answer: the hot SKUs should sell out")
			}
			if res.ErrorsByCode[loadgen.CodeAbandoned] == 0 {
				t.Errorf("no abandoned request (%v)", res.ErrorsByCode)
			}
			if c := res.Correctness; tc.exact && (!c.Clean() || c.Unresolved != 0) {
				t.Errorf("correctness %+v, want all zero and resolved", c)
			}
		})
	}
}

// TestBaselines_Cleanup checks that Close removes the schema or the keys and
// puts Redis's settings back.
func TestBaselines_Cleanup(t *testing.T) {
	ctx := context.Background()
	t.Run("Postgres", func(t *testing.T) {
		url := pgtest.NewDB(t)
		res := run(t, baseline.NewOneRow(baseline.PostgresConfig{DatabaseURL: url}), loadgen.Config{Model: loadgen.ModelA, SKUs: 3, Requests: 10, Concurrency: 2})
		if res.OK != 10 {
			t.Errorf("ok = %d, want 10", res.OK)
		}
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE 'loadgen_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d loadgen schemas left after Close, want 0", n)
		}
	})
	t.Run("Redis", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		before := map[string]string{}
		for _, p := range []string{"appendonly", "appendfsync"} {
			m, err := rdb.ConfigGet(ctx, p).Result()
			if err != nil {
				t.Fatal(err)
			}
			before[p] = m[p]
		}
		run(t, baseline.NewRedis(baseline.RedisConfig{Addr: redisAddr, Fsync: true}), loadgen.Config{Model: loadgen.ModelA, SKUs: 3, Requests: 10, Concurrency: 2})
		for p, v := range before {
			m, err := rdb.ConfigGet(ctx, p).Result()
			if err != nil {
				t.Fatal(err)
			}
			if m[p] != v {
				t.Errorf("after Close %s = %q, want %q as before", p, m[p], v)
			}
		}
		keys, _, err := rdb.Scan(ctx, 0, "loadgen:redis-fsync:*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 0 {
			t.Errorf("%d loadgen keys left after Close, e.g. %s", len(keys), keys[0])
		}
	})
}
