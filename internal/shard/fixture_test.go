package shard_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/api"
	reconcile1 "github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/shard"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openDB returns a migrated database of the test's own.
func openDB(tb testing.TB) (*postgres.DB, string) {
	tb.Helper()
	url := pgtest.NewMigratedDB(tb)
	db, err := postgres.Open(context.Background(), url, postgres.Options{MaxConns: 12, ApplicationName: "shardtest"})
	if err != nil {
		tb.Fatalf("postgres.Open: %v", err)
	}
	tb.Cleanup(db.Close)
	return db, url
}

// newServer starts a shard server (sweeper included) on db. Each of opts
// runs on the new server before it serves.
func newServer(tb testing.TB, db *postgres.DB, id string, opts ...func(*shard.Server)) *shard.Server {
	tb.Helper()
	return newServerWith(tb, shard.Config{ServerID: id, DB: db, Logger: testLogger()}, opts...)
}

// newServerWith starts a shard server of cfg (sweeper included).
func newServerWith(tb testing.TB, cfg shard.Config, opts ...func(*shard.Server)) *shard.Server {
	tb.Helper()
	s := shard.New(cfg)
	for _, o := range opts {
		o(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	return s
}

// acquire makes s own the partitions of the given shards at epoch.
func acquire(tb testing.TB, s *shard.Server, sku string, epoch int64, idx ...int32) {
	tb.Helper()
	for _, i := range idx {
		if err := s.Acquire(context.Background(), stock.PartitionOf(sku, i), epoch); err != nil {
			tb.Fatalf("Acquire(%s#%d, %d) = %v", sku, i, epoch, err)
		}
	}
}

func createSKU(tb testing.TB, db *postgres.DB, s stock.SKU, initial int64) {
	tb.Helper()
	if s.Status == "" {
		s.Status = stock.StatusActive
	}
	if s.ReservationTTL == 0 {
		s.ReservationTTL = stock.ReservationTTLDefault
	}
	if err := db.CreateSKU(context.Background(), s, initial); err != nil {
		tb.Fatalf("CreateSKU(%+v) = %v", s, err)
	}
}

// serve exposes s over real HTTP/2 (h2c) and returns a Connect client.
func serve(tb testing.TB, s *shard.Server) shardstockv1connect.ShardServiceClient {
	tb.Helper()
	mux := http.NewServeMux()
	mux.Handle(shardstockv1connect.NewShardServiceHandler(&api.ShardHandler{Server: s}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := transport.NewServer(mux)
	go srv.Serve(lis)
	tb.Cleanup(func() { srv.Close() })
	return shardstockv1connect.NewShardServiceClient(transport.NewClient(), "http://"+lis.Addr().String())
}

// reconcile fails the test unless the SKU's books balance.
func reconcile(tb testing.TB, db *postgres.DB, sku string) {
	tb.Helper()
	snap, err := db.Snapshot(context.Background(), sku)
	if err != nil {
		tb.Fatalf("Snapshot(%s) = %v", sku, err)
	}
	if ds := reconcile1.Check(snap); len(ds) > 0 {
		for _, d := range ds {
			tb.Errorf("discrepancy: %+v", d)
		}
		tb.FailNow()
	}
}

// total sums a SKU's shards.
func total(tb testing.TB, db *postgres.DB, sku string) stock.Counts {
	tb.Helper()
	rows, err := db.Shards(context.Background(), sku)
	if err != nil {
		tb.Fatalf("Shards(%s) = %v", sku, err)
	}
	var c stock.Counts
	for _, r := range rows {
		c = c.Add(r.Counts)
	}
	return c
}

// ledgerEntries returns every ledger entry of a SKU.
func ledgerEntries(tb testing.TB, db *postgres.DB, sku string) []*stock.LedgerEntry {
	tb.Helper()
	var all []*stock.LedgerEntry
	var after int64
	for {
		page, err := db.ListLedger(context.Background(), sku, after, 1000)
		if err != nil {
			tb.Fatalf("ListLedger = %v", err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].ID
	}
}

func countKind(es []*stock.LedgerEntry, k stock.OpKind) int {
	n := 0
	for _, e := range es {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// router is the test's stand-in for the allocator: it tries a SKU's shards
// starting at the key's hash, over real Connect clients, until one has stock.
type router struct {
	shards  int32
	clients map[int32]shardstockv1connect.ShardServiceClient // by shard index
}

func (r *router) do(ctx context.Context, op *v1.ShardOp) (*v1.ShardResult, error) {
	start := int32(hashKey(op.IdempotencyKey) % uint32(r.shards))
	var last *v1.ShardResult
	for i := int32(0); i < r.shards; i++ {
		op.Shard = (start + i) % r.shards
		resp, err := r.clients[op.Shard].Execute(ctx, connect.NewRequest(&v1.ExecuteRequest{Ops: []*v1.ShardOp{op}}))
		if err != nil {
			return nil, err
		}
		last = resp.Msg.Results[0]
		if e := last.GetError(); e == nil || e.Reason != string(stock.CodeOutOfStock) {
			return last, nil
		}
	}
	return last, nil
}

func hashKey(s string) uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// parallel runs f(i) for i in [0, n) on n goroutines, bounded by timeout.
func parallel(tb testing.TB, n int, timeout time.Duration, f func(i int)) {
	tb.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(i) }()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		tb.Fatalf("parallel(%d) did not finish within %s", n, timeout)
	}
}

// testLogger discards logs unless the test runs with -v.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.Default()
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func key(prefix string, i int) string { return fmt.Sprintf("%s-%04d", prefix, i) }
