package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
)

// Bounds of TestE2E_StoppedShardServer.
const (
	// stopRecoveryBound is what serving again after the stop may take
	// beyond the lease TTL (issue 10's goal: the TTL plus one second). It
	// covers etcd's lease expiry check (every 500 ms), the watch events,
	// the new owner's claim and takeover, and one batch: measured 0.4 to
	// 0.5 s on the 2-core machine, up to 0.7 s with two CPU hogs beside
	// it (docs/reliability.md).
	stopRecoveryBound = time.Second
	// stoppedFor is how long the server stays stopped: longer than the
	// callers' deadline, as in the issue, so that a caller that waits for
	// the stopped server instead of its partitions' new owner shows.
	stoppedFor = 10 * time.Second
	// stopCallTimeout is each call's deadline, the clients' 10 s.
	stopCallTimeout = 10 * time.Second
	stopClients     = 16
	// stopAttemptsMax bounds the retries of one key.
	stopAttemptsMax = 100
)

// ack is one acknowledged deduct.
type ack struct {
	key   string
	shard int32
	at    time.Time
}

// TestE2E_StoppedShardServer stops (SIGSTOP) one of three shard-server
// processes under closed-loop deducts for longer than the callers'
// deadline. Its lease runs out and the others take its partitions over;
// the allocator must stop waiting for the stopped server: requests are
// served again within the lease TTL plus stopRecoveryBound, the stopped
// server's partitions on their new owners too (a batch it left open holding
// their fence rows is ended by the takeover: postgres.TakeOver). Then the
// server is continued: the
// zombie is fenced
// (nothing it writes at its old epochs lands after the new owner's first
// write of the partition), and every acknowledged deduct is in the ledger
// exactly once.
func TestE2E_StoppedShardServer(t *testing.T) {
	s := newStack(t, 3)
	const sku = "stop"
	const shards = 16
	s.createSKU(sku, 1_000_000, shards)
	ctx := context.Background()

	var mu sync.Mutex
	var acks []ack
	record := func(key string, resp *v1.DeductResponse) {
		mu.Lock()
		acks = append(acks, ack{key: key, shard: resp.Operation.Shard, at: time.Now()})
		mu.Unlock()
	}
	// Start-up hand-overs claim partitions in etcd before the new owner has
	// taken them over in Postgres: wait until every shard answers.
	for i := range 4 * shards {
		key := fmt.Sprintf("warm-%d", i)
		for attempt := 0; ; attempt++ {
			resp, err := s.deduct(ctx, sku, key, 1)
			if err == nil {
				record(key, resp)
				break
			} else if attempt > stopAttemptsMax {
				t.Fatalf("warm-up Deduct(%s) = %v", key, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The victim and what it owns: partitions at their epochs, and the
	// SKU's shards in them.
	const victim = "s1"
	topo, err := s.admin.GetTopology(ctx, adminReq(&v1.GetTopologyRequest{}))
	if err != nil {
		t.Fatalf("GetTopology = %v", err)
	}
	oldEpoch := map[int32]int64{} // partition -> the victim's epoch
	for _, o := range topo.Msg.Owners {
		if o.ServerId == victim {
			oldEpoch[o.Partition] = o.Epoch
		}
	}
	victimShard := map[int32]bool{}
	for i := range int32(shards) {
		if _, ok := oldEpoch[stock.PartitionOf(sku, i)]; ok {
			victimShard[i] = true
		}
	}
	if len(victimShard) == 0 {
		t.Fatalf("%s owns none of the %d shards of %s", victim, shards, sku)
	}

	// Closed-loop clients: each retries its key (same key) until it is
	// acknowledged, then takes the next, until told to stop.
	var stopLoad atomic.Bool
	var deadlines, unavailables atomic.Int64
	var lastOK atomic.Int64 // unix nanoseconds of the latest success
	var load sync.WaitGroup
	for g := range stopClients {
		load.Go(func() {
			for i := 0; !stopLoad.Load(); i++ {
				key := fmt.Sprintf("stop-%02d-%05d", g, i)
				for attempt := 0; ; attempt++ {
					rctx, cancel := context.WithTimeout(ctx, stopCallTimeout)
					resp, err := s.deduct(rctx, sku, key, 1)
					cancel()
					if err == nil {
						record(key, resp)
						lastOK.Store(time.Now().UnixNano())
						break
					}
					switch connect.CodeOf(err) {
					case connect.CodeDeadlineExceeded:
						deadlines.Add(1)
					case connect.CodeUnavailable, connect.CodeAborted:
						unavailables.Add(1)
					default:
						t.Errorf("Deduct(%s) = %v, want success or a retryable error", key, err)
						return
					}
					if attempt >= stopAttemptsMax {
						t.Errorf("Deduct(%s): still failing after %d attempts: %v", key, attempt, err)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	loadDone := make(chan struct{})
	go func() { load.Wait(); close(loadDone) }()

	// Stop the victim once it is seen serving the load.
	victimAcks := func(after time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range acks {
			if victimShard[a.shard] && a.at.After(after) {
				n++
			}
		}
		return n
	}
	loadStart := time.Now()
	for victimAcks(loadStart) < 50 {
		if time.Since(loadStart) > startTimeout {
			t.Fatalf("%s served %d deducts in %s, want 50 before stopping it", victim, victimAcks(loadStart), startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	proc := s.shards[victim]
	stopAt := time.Now()
	if err := proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer proc.cmd.Process.Signal(syscall.SIGCONT)
	time.Sleep(stoppedFor)
	contAt := time.Now()
	if err := proc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// It joins again under load and takes its share back.
	s.waitStable(startTimeout)
	time.Sleep(time.Second)
	stopLoad.Store(true)
	select {
	case <-loadDone:
	case <-time.After(5 * time.Minute):
		t.Fatal("the clients did not finish")
	}
	if t.Failed() {
		return
	}
	entries := s.ledger(sku)

	// The first request served on the victim's partitions after the stop
	// must have been written by their new owner, not answered by the
	// victim just before it stopped.
	writer := map[string]*v1.LedgerEntry{}
	for _, e := range entries {
		if e.Kind == string(stock.OpDeduct) {
			writer[e.IdempotencyKey] = e
		}
	}
	mu.Lock()
	slices.SortFunc(acks, func(a, b ack) int { return a.at.Compare(b.at) })
	mu.Unlock()
	var recovered time.Duration
	var stall time.Duration // the longest time without any success after the stop
	prev := stopAt
	for _, a := range acks {
		if !a.at.After(stopAt) {
			continue
		}
		if prev.Before(contAt) {
			stall = max(stall, minTime(a.at, contAt).Sub(prev))
		}
		prev = a.at
		if e := writer[a.key]; recovered == 0 && victimShard[a.shard] && e != nil && e.ServerId != victim {
			recovered = a.at.Sub(stopAt)
		}
	}
	// When the new owners first wrote each of the victim's partitions,
	// on the database's clock (the same machine's).
	var firstWrites []string
	seen := map[int32]bool{}
	for _, e := range entries {
		p := stock.PartitionOf(sku, e.Shard)
		if old, ok := oldEpoch[p]; ok && e.Epoch > old && !seen[p] && e.CreatedAt.AsTime().After(stopAt) {
			seen[p] = true
			firstWrites = append(firstWrites, fmt.Sprintf("%d:%s", p, e.CreatedAt.AsTime().Sub(stopAt).Round(time.Millisecond)))
		}
	}
	recoveryMax := leaseTTL + stopRecoveryBound
	t.Logf("lease TTL %s: first deduct served on a stopped server's partition %s after the stop (bound %s); longest time without any success while it was stopped %s (bound %s); first write of each of its partitions by the new owner after %v; %d DEADLINE_EXCEEDED and %d UNAVAILABLE answers; %d deducts acknowledged",
		leaseTTL, recovered, recoveryMax, stall, leaseTTL+stopRecoveryBound, firstWrites, deadlines.Load(), unavailables.Load(), len(acks))
	if recovered == 0 || recovered > recoveryMax {
		t.Errorf("first deduct served on a stopped server's partition after %s (0: none while stopped), want within %s", recovered, recoveryMax)
	}
	if stall > leaseTTL+stopRecoveryBound {
		t.Errorf("no deduct succeeded for %s while a shard server was stopped, want at most %s", stall, leaseTTL+stopRecoveryBound)
	}

	// The race happened: the allocator had calls in flight to the victim
	// when its partitions moved, which the victim could still try to
	// apply when it ran again.
	if n := s.allocatorCounter(`shardstock_allocator_abandoned_calls_total{server="` + victim + `"}`); n == 0 {
		t.Errorf("no call to %s was abandoned: it had nothing in flight when it stopped", victim)
	} else {
		t.Logf("%d calls to %s abandoned for their partitions' new owners; %s logged %d fenced batches after it ran again",
			n, victim, victim, strings.Count(proc.output(), "batch fenced"))
	}

	// Fenced: per partition the victim owned, nothing it wrote at that
	// epoch comes after the first write at a newer epoch.
	lastOld, firstNew := map[int32]int64{}, map[int32]int64{}
	for _, e := range entries {
		p := stock.PartitionOf(sku, e.Shard)
		old, ok := oldEpoch[p]
		switch {
		case !ok:
		case e.Epoch == old && e.ServerId == victim:
			lastOld[p] = max(lastOld[p], e.Id)
		case e.Epoch > old && firstNew[p] == 0:
			firstNew[p] = e.Id
		}
	}
	taken := 0
	for p, first := range firstNew {
		taken++
		if lastOld[p] > first {
			t.Errorf("partition %d: %s wrote ledger entry %d at its old epoch %d after the new owner's entry %d", p, victim, lastOld[p], oldEpoch[p], first)
		}
	}
	if taken == 0 {
		t.Errorf("no partition of %s was written at a newer epoch: the fence was not tested", victim)
	}

	// Exactly once: every acknowledged key has one deduct entry, and every
	// deduct entry was acknowledged.
	count := map[string]int{}
	for _, e := range entries {
		if e.Kind == string(stock.OpDeduct) {
			count[e.IdempotencyKey]++
		}
	}
	acked := map[string]bool{}
	for _, a := range acks {
		acked[a.key] = true
		if count[a.key] != 1 {
			t.Errorf("acknowledged deduct %s is in the ledger %d times, want 1", a.key, count[a.key])
		}
	}
	for key := range count {
		if !acked[key] {
			t.Errorf("deduct %s is in the ledger but was never acknowledged", key)
		}
	}
	st := s.stock(sku)
	if st.Sold != int64(len(acked)) || st.Sold+st.Available != 1_000_000 {
		t.Errorf("sold %d, available %d, acknowledged %d: want sold = acknowledged and sold + available = 1000000", st.Sold, st.Available, len(acked))
	}
	s.reconcile(sku)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ledger returns every ledger entry of a SKU, oldest first.
func (s *stack) ledger(sku string) []*v1.LedgerEntry {
	s.t.Helper()
	var out []*v1.LedgerEntry
	token := ""
	for {
		resp, err := s.admin.ListLedger(context.Background(), adminReq(&v1.ListLedgerRequest{Sku: sku, PageToken: token, PageSize: 1000}))
		if err != nil {
			s.t.Fatalf("ListLedger(%s) = %v", sku, err)
		}
		out = append(out, resp.Msg.Entries...)
		if token = resp.Msg.NextPageToken; token == "" {
			return out
		}
	}
}

// allocatorCounter returns the value of one sample of the allocator's
// /metrics, 0 if it is absent. It may be called from any goroutine.
func (s *stack) allocatorCounter(sample string) int64 {
	s.t.Helper()
	resp, err := http.Get(s.ops + "/metrics")
	if err != nil {
		s.t.Errorf("GET /metrics: %v", err)
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return int64(v)
}
