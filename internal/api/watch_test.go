package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/transport"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Bounds of TestWatchLedger_StuckConsumer.
const (
	stuckEntries  = 3000                   // far more than the client's window holds
	stuckWindow   = 64 << 10               // the client's HTTP/2 receive window, per stream and connection
	stuckSendMax  = 500 * time.Millisecond // the handler's WatchSendMax
	stuckEndedMax = 10 * time.Second       // by when the watch must have ended
)

// TestWatchLedger_StuckConsumer: a real HTTP/2 client starts WatchLedger
// over a ledger of stuckEntries, takes one message and stops reading
// without closing. Its window fills, the server's send blocks, and
// within WatchSendMax the watch ends (it counts itself out of
// shardstock_watch_consumers) and its stream is reset: reading on, the
// client gets an error after what it had buffered.
func TestWatchLedger_StuckConsumer(t *testing.T) {
	ctx := context.Background()
	admin, reg := startWatchServer(t, "stuck", stuckEntries, &http.HTTP2Config{MaxReceiveBufferPerStream: stuckWindow, MaxReceiveBufferPerConnection: stuckWindow}, nil)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := admin.WatchLedger(wctx, connect.NewRequest(&v1.WatchLedgerRequest{Consumer: "stuck"}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() {
		t.Fatalf("WatchLedger: no first message: %v", s.Err())
	}
	if n := watching(t, reg); n != 1 {
		t.Fatalf("shardstock_watch_consumers{stream=\"ledger\"} = %v with the watch open, want 1", n)
	}
	// It stops reading.
	start := time.Now()
	for watching(t, reg) != 0 {
		if time.Since(start) > stuckEndedMax {
			t.Fatalf("a consumer that stopped reading still watched after %s (WatchSendMax %s)", stuckEndedMax, stuckSendMax)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a consumer that stopped reading after one message was ended after %s (WatchSendMax %s)", time.Since(start).Round(time.Millisecond), stuckSendMax)
	received := 1
	for s.Receive() {
		received++
	}
	if s.Err() == nil || received >= stuckEntries {
		t.Errorf("reading on after the reset: %d messages, then %v; want fewer than %d and an error", received, s.Err(), stuckEntries)
	}
}

// startWatchServer starts a WatchLedger server (the admin API's handler
// options, WatchWriter, a WatchSendMax of stuckSendMax) on a private database whose ledger holds n
// entries of sku, keyed k-1 to k-n in id order, and returns a client of it
// over cleartext HTTP/2 (cfg: the client's settings, nil for the default)
// and the stream's metrics. wrap, if not nil, wraps the server's handler.
func startWatchServer(t testing.TB, sku string, n int, cfg *http.HTTP2Config, wrap func(http.Handler) http.Handler) (shardstockv1connect.AdminServiceClient, *prometheus.Registry) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewPrivateDBs(t, 1)[0] // the stream waits for the cluster's oldest transaction
	db, err := postgres.Open(ctx, url, postgres.Options{ApplicationName: "apiwatch"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO ledger (sku, shard, kind, quantity, available_before, available_after,
		reserved_before, reserved_after, sold_before, sold_after, idempotency_key, source, server_id, epoch)
		SELECT $1, 0, 'replenish', 1, g - 1, g, 0, 0, 0, 0, 'k-' || g, 'test', 'test', 1 FROM generate_series(1, $2) g`, sku, n); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	stream := ledger.NewStream(ledger.StreamConfig{Readers: map[string]ledger.Reader{"main": db}, PollInterval: 20 * time.Millisecond, Registerer: reg})
	path, h := shardstockv1connect.NewAdminServiceHandler(&AdminHandler{Changes: stream, WatchSendMax: stuckSendMax}, transport.PublicHandlerOptions()...)
	h = WatchWriter(h)
	if wrap != nil {
		h = wrap(h)
	}
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)

	var cp http.Protocols
	cp.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &cp, HTTP2: cfg}}
	return shardstockv1connect.NewAdminServiceClient(client, srv.URL), reg
}

// burstEntries is TestWatchLedger_Burst's ledger: a few pages of the
// stream's reads.
const burstEntries = 1000

// flushCounter counts the flushes of the responses under it.
type flushCounter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (f flushCounter) Flush() {
	f.n.Add(1)
	_ = http.NewResponseController(f.ResponseWriter).Flush()
}

func (f flushCounter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// TestWatchLedger_Burst: a consumer reading a ledger of burstEntries
// receives every entry, in order, and the server flushes its stream once a
// page of the ledger, not once an entry: the entries of a page go out in
// the frames they fill (burstWriter).
func TestWatchLedger_Burst(t *testing.T) {
	var flushes atomic.Int64
	admin, _ := startWatchServer(t, "burst", burstEntries, nil, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(flushCounter{ResponseWriter: w, n: &flushes}, r)
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), stuckEndedMax)
	defer cancel()
	s, err := admin.WatchLedger(ctx, connect.NewRequest(&v1.WatchLedgerRequest{Consumer: "burst"}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	received := 0
	for received < burstEntries && s.Receive() {
		if e := s.Msg().GetEntry(); e != nil {
			received++
			if want := fmt.Sprintf("k-%d", received); e.GetIdempotencyKey() != want {
				t.Fatalf("entry %d is %s, want %s", received, e.GetIdempotencyKey(), want)
			}
		}
	}
	if received != burstEntries {
		t.Fatalf("received %d entries, then %v; want %d", received, s.Err(), burstEntries)
	}
	// A page of the stream's is 256 entries: four pages, and a flush for
	// the response's headers and any cursor sent alone.
	if n := flushes.Load(); n > burstEntries/20 {
		t.Errorf("%d flushes for %d entries, want at most %d (one a page)", n, burstEntries, burstEntries/20)
	}
	t.Logf("%d entries in %d flushes", received, flushes.Load())
}

// benchEntries is BenchmarkWatchLedger's ledger.
const benchEntries = 20_000

// BenchmarkWatchLedger: a consumer over real HTTP/2 reads a ledger of
// benchEntries from its beginning, again and again; cpu-µs/entry is this
// process's CPU (server and client, both here) per entry received.
func BenchmarkWatchLedger(b *testing.B) {
	admin, _ := startWatchServer(b, "bench", benchEntries, nil, nil)
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	received := 0
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := admin.WatchLedger(ctx, connect.NewRequest(&v1.WatchLedgerRequest{Consumer: "bench"}))
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < benchEntries && s.Receive(); {
			if s.Msg().GetEntry() != nil {
				n++
				received++
			}
		}
		s.Close()
		cancel()
	}
	b.ReportMetric(float64(cpu()-start)/float64(time.Microsecond)/float64(received), "cpu-µs/entry")
}

// watching returns shardstock_watch_consumers{stream="ledger"} of reg.
func watching(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "shardstock_watch_consumers" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stream" && l.GetValue() == "ledger" {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
