package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
)

// TestE2E_AllocatorShard: an allocator started with -shard-id runs a shard
// server in its own process beside a separate one. Requests for its
// partitions take the in-process path, the others RPC; both sell exactly
// the stock, replay retries with their first result, and balance. When the
// separate server is killed, the allocator's own shard server takes its
// partitions over and the replays still answer from the shards it now owns.
func TestE2E_AllocatorShard(t *testing.T) {
	const local = "alloc"
	s := newStackWith(t, 1, local)
	ctx := context.Background()

	// A SKU whose 8 shards fall on both servers.
	owners := s.owners()
	sku := ""
	for i := 0; sku == "" && i < 100; i++ {
		name := fmt.Sprintf("local-sku-%d", i)
		seen := map[string]bool{}
		for idx := range int32(8) {
			seen[owners[stock.ShardKey{SKU: name, Index: idx}.Partition()]] = true
		}
		if seen[local] && seen["s1"] {
			sku = name
		}
	}
	if sku == "" {
		t.Fatal("no SKU name with shards on both servers")
	}
	const units, requests = 100, 150
	s.createSKU(sku, units, 8)

	var ok, oos atomic.Int64
	parallel(t, requests, 30*time.Second, func(i int) {
		_, err := s.deduct(ctx, sku, fmt.Sprintf("k-%d", i), 1)
		switch {
		case err == nil:
			ok.Add(1)
		case reason(err) == string(stock.CodeOutOfStock):
			oos.Add(1)
		default:
			t.Errorf("deduct k-%d: %v", i, err)
		}
	})
	if ok.Load() != units || oos.Load() != requests-units {
		t.Fatalf("%d successes and %d out of stock, want %d and %d", ok.Load(), oos.Load(), units, requests-units)
	}
	// Both paths carried requests: the in-process one for the allocator's
	// own partitions, RPC for the others.
	if local, remote := s.counter(`shardstock_allocator_shard_requests_total{path="local"}`),
		s.counter(`shardstock_allocator_shard_requests_total{path="rpc"}`); local == 0 || remote == 0 {
		t.Errorf("requests to shard servers: %v local, %v over RPC; want both", local, remote)
	}
	// The ShardService (no authentication) is not on the public port.
	shardSvc := shardstockv1connect.NewShardServiceClient(transport.NewClient(), s.base)
	_, err := shardSvc.Execute(ctx, connect.NewRequest(&v1.ExecuteRequest{}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("ShardService.Execute on the allocator's public port = %v, want unimplemented (not served)", err)
	}
	replays := func(when string) {
		t.Helper()
		var replayed atomic.Int64
		parallel(t, requests, 30*time.Second, func(i int) {
			resp, err := s.deduct(ctx, sku, fmt.Sprintf("k-%d", i), 1)
			switch {
			case err == nil && resp.Replayed:
				replayed.Add(1)
			case err == nil:
				t.Errorf("%s: k-%d applied again", when, i)
			case reason(err) != string(stock.CodeOutOfStock):
				t.Errorf("%s: k-%d: %v", when, i, err)
			}
		})
		if replayed.Load() != units {
			t.Errorf("%s: %d replays, want %d", when, replayed.Load(), units)
		}
		if st := s.stock(sku); st.Available != 0 || st.Sold != units {
			t.Errorf("%s: stock %v, want 0 available, %d sold", when, st, units)
		}
		s.reconcile(sku)
	}
	replays("with two servers")

	s.shards["s1"].stop(syscall.SIGKILL)
	s.waitStable(leaseTTL + 8*time.Second)
	for p, o := range s.owners() {
		if o != local {
			t.Fatalf("partition %d owned by %q after the kill, want %q", p, o, local)
		}
	}
	replays("after the kill")
	s.createSKU(sku+"-b", 5, 4)
	for i := range 6 {
		_, err := s.deduct(ctx, sku+"-b", fmt.Sprintf("b-%d", i), 1)
		if (i < 5) != (err == nil) {
			t.Errorf("deduct b-%d of 5 units: %v", i, err)
		}
	}
	s.reconcile(sku + "-b")
}

// counter returns the value of one sample in the allocator's /metrics
// (0 if absent).
func (s *stack) counter(sample string) float64 {
	s.t.Helper()
	n, err := s.sample(sample)
	if err != nil {
		s.t.Fatal(err)
	}
	return n
}

// sample is counter, with the error instead of a failure.
func (s *stack) sample(sample string) (float64, error) {
	resp, err := http.Get(s.ops + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("metric %s: %w", sample, err)
			}
			return n, nil
		}
	}
	return 0, sc.Err()
}

// owners returns the owner of every partition.
func (s *stack) owners() map[int32]string {
	s.t.Helper()
	resp, err := s.admin.GetTopology(context.Background(), adminReq(&v1.GetTopologyRequest{}))
	if err != nil {
		s.t.Fatalf("GetTopology = %v", err)
	}
	out := map[int32]string{}
	for _, o := range resp.Msg.Owners {
		out[o.Partition] = o.ServerId
	}
	return out
}
