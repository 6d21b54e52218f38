package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/shardnode"
	"github.com/shardstock/shardstock/internal/transport"
)

// Bounds of the overload test. SHARDSTOCK_OVERLOAD_SECONDS lengthens the
// burst (make overload: 30 s); make test runs a short one.
const (
	overloadInFlight = 128             // the allocator's -max-in-flight
	overloadClients  = 32              // closed-loop clients measuring the peak and the recovery
	overloadMeasure  = 2 * time.Second // each peak measurement
	// overloadRecoverWindows bounds the measurements after the burst: the
	// service must serve at 80% of its peak again within them. Three were
	// too few on a CI run whose other lane loaded the machine after the
	// peak was measured (66% of it in each); a service that does not
	// recover stays below in every one.
	overloadRecoverWindows = 5
	overloadRSSMax         = 512 << 20     // the allocator's resident memory bound during the burst: its pod's limit (deploy/k8s)
	overloadStock          = 1_000_000_000 // never sells out
	overloadNice           = 10            // the service's processes' niceness during the burst
	// overloadAnsweredMin: during the burst the service answers (serves
	// or sheds) at least this many times its peak: refusing must cost far
	// less than serving. (A refusal made to cost 2 ms of CPU held it to
	// 0.8 times the peak: its answers came back so slowly that the
	// clients' calls waiting filled up.) Healthy runs: 2.5 to 3.5 times,
	// bounded by what the test's client can send.
	overloadAnsweredMin = 1.5
	// The burst's clients: overloadConns HTTP/2 connections, each with at
	// most overloadStreams calls waiting at once (5,000 in all), under
	// the 250 streams Go's server allows a connection. A fleet of clients,
	// not one Go client: Go's h2c transport dials a connection for each
	// call beyond its connections' streams, and 20,000 calls at once made
	// thousands of dials, the listen queue dropped their SYNs (21,175 in
	// three runs) and calls waited for SYN retransmits past their
	// deadline. (Its StrictMaxConcurrentRequests, which waits for a stream
	// instead, stalled whole connections: golang/go#70809.) Not 20,000
	// waiting: with that many this process, at a full core, was the
	// queue (the allocator's frame readers sat idle, waiting for data),
	// and answers came back late for want of the client's own CPU.
	overloadConns   = 100
	overloadStreams = 50
)

// TestE2E_Overload: a burst of ten times the peak rate (open loop: requests
// sent on a clock, whatever the answers) is shed with RATE_LIMITED or a
// retryable unavailable, the allocator's memory stays under
// overloadRSSMax, it serves at 80% of its peak again within seconds (in
// one of overloadRecoverWindows measurements), and every acknowledged
// deduct is in the books exactly once.
func TestE2E_Overload(t *testing.T) {
	burst := 5 * time.Second
	if v := os.Getenv("SHARDSTOCK_OVERLOAD_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SHARDSTOCK_OVERLOAD_SECONDS=%q", v)
		}
		burst = time.Duration(n) * time.Second
	}
	// The allocator as deploy/k8s runs it: in a pod of overloadRSSMax,
	// whose cgroup limit internal/cmd/startup turns into a soft memory
	// limit of 90% (automemlimit); this machine's cgroup has no such limit.
	// Its shard servers with the production lease TTL, and its etcd in a
	// process of its own at normal priority: this test's process makes
	// the burst, and an etcd inside it answered no keep-alive for nine
	// seconds on CI (every lease expired; the recovery then measured the
	// re-registration and 1,673 answers ran out of deadline waiting for an
	// owner). Now the burst starves only what a real client's would.
	s := newStackOpts(t, stackOpts{shardServers: 2, ttl: shardnode.LeaseTTLDefault, etcdProcess: true,
		allocArgs: []string{"-max-in-flight", strconv.Itoa(overloadInFlight)},
		allocEnv:  []string{fmt.Sprintf("GOMEMLIMIT=%d", overloadRSSMax/10*9)}})
	const sku = "overload"
	s.createSKU(sku, overloadStock, 8)
	var seq atomic.Int64
	var ackMu sync.Mutex
	acked := map[string]bool{}
	// deduct sends one deduct of a new key through client.
	deduct := func(ctx context.Context, client shardstockv1connect.InventoryServiceClient) error {
		key := fmt.Sprintf("ov-%d", seq.Add(1))
		_, err := client.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: key}))
		if err == nil {
			ackMu.Lock()
			acked[key] = true
			ackMu.Unlock()
		}
		return err
	}
	peak := closedLoopRate(t, func(ctx context.Context) error { return deduct(ctx, s.inv) })
	pid := s.allocator.cmd.Process.Pid

	// The burst: 10x the peak, open loop. On a machine whose cores the
	// client shares with the service, the service's processes run at a
	// lower priority meanwhile, so that the client sends what it asks,
	// as one on other machines would; they get every cycle the client
	// leaves.
	servers := []int{pid}
	for _, p := range s.shards {
		servers = append(servers, p.cmd.Process.Pid)
	}
	nice := func(n int) {
		for _, p := range servers {
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, p, n); err != nil {
				t.Logf("setpriority(%d, %d): %v", p, n, err)
			}
		}
	}
	nice(overloadNice)
	rate := 10 * peak
	type member struct {
		client shardstockv1connect.InventoryServiceClient
		slots  chan struct{} // its calls waiting
	}
	fleet := make([]member, overloadConns)
	for i := range fleet {
		fleet[i] = member{shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), s.base, asService), make(chan struct{}, overloadStreams)}
	}
	var sent, ok, shed, other atomic.Int64
	var otherErr atomic.Value
	var rssMax atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), burst+30*time.Second)
	defer cancel()
	stopRSS := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopRSS:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if r := rss(pid); r > rssMax.Load() {
				rssMax.Store(r)
			}
		}
	}()
	var wg sync.WaitGroup
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	next := start
	for i := 0; time.Since(start) < burst; i++ {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		m := fleet[i%len(fleet)]
		select {
		case m.slots <- struct{}{}:
		default:
			continue // this client cannot keep more waiting: not sent
		}
		sent.Add(1)
		wg.Go(func() {
			defer func() { <-m.slots }()
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			defer rcancel()
			err := deduct(rctx, m.client)
			switch {
			case err == nil:
				ok.Add(1)
			case reason(err) == "RATE_LIMITED" || connect.CodeOf(err) == connect.CodeUnavailable:
				shed.Add(1)
			default:
				other.Add(1)
				otherErr.Store(err)
			}
		})
	}
	offered := float64(sent.Load()) / time.Since(start).Seconds()
	wg.Wait()
	nice(0)
	close(stopRSS)
	// Recovered: a window at 80% of the peak within overloadRecoverWindows
	// of them. One window alone reads the machine's moment as much as the
	// service's: the machine is shared, and a shard server whose lease
	// keep-alives the burst starved registers again first.
	after := time.Now()
	var recovered float64
	for w := 0; w < overloadRecoverWindows && recovered < 0.8*peak; w++ {
		recovered = closedLoopRate(t, func(ctx context.Context) error { return deduct(ctx, s.inv) })
	}
	recoveredIn := time.Since(after)

	t.Logf("peak %.0f/s; burst of %s at %.0f/s asked, %.0f/s sent (the client's own bound), %d sent: %d served, %d shed (RATE_LIMITED or unavailable), %d other; allocator RSS at most %d MiB; after it %.0f/s (%.0f%% of the peak), measured within %s",
		peak, burst, rate, offered, sent.Load(), ok.Load(), shed.Load(), other.Load(), rssMax.Load()>>20, recovered, 100*recovered/peak, recoveredIn.Round(100*time.Millisecond))
	if other.Load() > 0 {
		t.Errorf("%d answers neither served nor shed, e.g. %v", other.Load(), otherErr.Load())
	}
	if offered < overloadAnsweredMin*peak {
		t.Errorf("the burst was answered at %.0f/s, %.1f times the peak: want at least %.1f times (refusals cheaper than serving)", offered, offered/peak, overloadAnsweredMin)
	}
	if shed.Load() == 0 {
		t.Errorf("nothing shed by a burst above the peak")
	}
	if rssMax.Load() > overloadRSSMax {
		t.Errorf("allocator RSS reached %d MiB, bound %d MiB", rssMax.Load()>>20, overloadRSSMax>>20)
	}
	if recovered < 0.8*peak {
		t.Errorf("after the burst %.0f/s, want at least 80%% of the peak %.0f/s", recovered, peak)
	}
	// Every acknowledged deduct is in the ledger once; a shed one is not;
	// one whose answer never came (a client deadline) may be.
	entries := map[string]int{}
	for _, e := range s.ledger(sku) {
		entries[e.GetIdempotencyKey()]++
	}
	for key := range acked {
		if entries[key] != 1 {
			t.Errorf("acknowledged key %s has %d ledger entries, want 1", key, entries[key])
			break
		}
	}
	var applied int64
	for _, n := range entries {
		applied += int64(n)
	}
	if st := s.stock(sku); st.Sold != applied || int64(len(acked)) > applied {
		t.Errorf("sold %d, ledger deducts %d, acknowledged %d", st.Sold, applied, len(acked))
	}
	s.reconcile(sku)
}

// closedLoopRate is the rate overloadClients clients reach in
// overloadMeasure, each sending its next request when the last is answered.
func closedLoopRate(t *testing.T, deduct func(context.Context) error) float64 {
	t.Helper()
	var n atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), overloadMeasure)
	defer cancel()
	var wg sync.WaitGroup
	for range overloadClients {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := deduct(ctx); err == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / overloadMeasure.Seconds()
}

// rss is a process's resident memory in bytes, 0 if unknown.
func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
