package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/shardnode"
	"github.com/shardstock/shardstock/internal/transport"
)

// Bounds of TestE2E_SlowLargeBodies: the attack of issue 30, tried on
// `make run` before the read-ahead bound (the allocator went from 36 to
// 1,265 MiB resident).
const (
	slowConns     = 40  // HTTP/2 connections, far under -max-client-conns
	slowStreams   = 250 // per connection: Go's server allows 250 at once
	slowBodyBytes = 65_000
	// slowRSSMax is the allocator's container limit (deploy/k8s).
	slowRSSMax = 512 << 20
	// The attack is held until the allocator's memory has not grown for
	// slowSettled, at least slowHold and at most slowHoldMax: a few
	// seconds, as the read-ahead's refusals come at once.
	slowHold          = 3 * time.Second
	slowSettled       = time.Second
	slowHoldMax       = 10 * time.Second
	slowHonestLatency = 2 * time.Second
)

// TestE2E_SlowLargeBodies: the built allocator, a process of its own with
// its default bounds, under slowConns HTTP/2 connections of slowStreams
// streams each, every stream sending slowBodyBytes of a Deduct and never
// finishing it: its resident memory (/proc) stays under its container's
// limit, and a service's honest Deduct is answered meanwhile.
func TestE2E_SlowLargeBodies(t *testing.T) {
	// Its own shard server with the production lease TTL and etcd in a
	// process of its own, as in TestE2E_Overload: this test's process
	// makes the attack, and an etcd inside it, with the tests' 2 s TTL,
	// renewed no lease for 5 s on CI (the own shard's partitions went
	// unowned and the honest Deduct was refused UNAVAILABLE).
	s := newStackOpts(t, stackOpts{localID: "own", ttl: shardnode.LeaseTTLDefault, etcdProcess: true})
	const sku = "slow-bodies"
	s.createSKU(sku, 1_000, 4)
	pid := s.allocator.cmd.Process.Pid
	before := rss(pid)
	if before == 0 {
		t.Skip("needs /proc/PID/status for the allocator's resident memory")
	}

	ctx, cancel := context.WithCancel(context.Background())
	body := strings.Repeat("x", slowBodyBytes)
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[int]int{} // by HTTP status, before the attack ended
	for range slowConns {
		hc := transport.NewClient() // a connection of its own
		for range slowStreams {
			wg.Go(func() {
				pr, pw := io.Pipe()
				go func() {
					if _, err := io.WriteString(pw, body); err == nil {
						<-ctx.Done() // and never the rest
					}
					pw.CloseWithError(ctx.Err())
				}()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+shardstockv1connect.InventoryServiceDeductProcedure, pr)
				req.Header.Set("Content-Type", "application/proto")
				req.Header.Set("Authorization", "Bearer "+serviceToken)
				resp, err := hc.Do(req)
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				answers[resp.StatusCode]++
				mu.Unlock()
			})
		}
	}
	// Sampled until it settles, passes its bound, or time runs out.
	peak, began, settled := before, time.Now(), time.Now()
	for held := time.Duration(0); held < slowHoldMax && peak <= slowRSSMax; held = time.Since(began) {
		time.Sleep(100 * time.Millisecond)
		if r := rss(pid); r > peak+1<<20 {
			peak, settled = r, time.Now()
		}
		if held >= slowHold && time.Since(settled) >= slowSettled {
			break
		}
	}
	held := time.Since(began)
	start := time.Now()
	_, err := s.inv.Deduct(context.Background(), connect.NewRequest(&v1.DeductRequest{Sku: sku, Quantity: 1, IdempotencyKey: "honest"}))
	took := time.Since(start)
	cancel()
	wg.Wait()
	if err != nil || took > slowHonestLatency {
		t.Errorf("an honest Deduct during the attack = %v after %s, want served within %s", err, took, slowHonestLatency)
	}
	if peak > slowRSSMax {
		t.Errorf("the allocator's resident memory reached %d MiB under %d slow streams of %d bytes, want under %d MiB", peak>>20, slowConns*slowStreams, slowBodyBytes, slowRSSMax>>20)
	}
	mu.Lock()
	t.Logf("allocator's resident memory %d MiB before, %d MiB at most with %d slow streams held %s; honest Deduct in %s; attack's answers by HTTP status: %s",
		before>>20, peak>>20, slowConns*slowStreams, held.Round(time.Millisecond), took.Round(time.Millisecond), fmt.Sprint(answers))
	mu.Unlock()
}
