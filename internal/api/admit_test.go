package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// clientAddr believes X-Forwarded-For only from a trusted proxy, and then
// only the hops the proxies appended.
func TestClientAddr(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32")}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"NoProxy", "203.0.113.9:4000", nil, "203.0.113.9"},
		{"SpoofedFromAClient", "203.0.113.9:4000", []string{"198.51.100.1"}, "203.0.113.9"},
		{"BehindTheProxy", "10.1.2.3:4000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"ClientPrependsALie", "10.1.2.3:4000", []string{"192.0.2.66, 198.51.100.1"}, "198.51.100.1"},
		{"TwoProxies", "10.1.2.3:4000", []string{"198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"TwoHeaders", "127.0.0.1:4000", []string{"192.0.2.66", "198.51.100.2"}, "198.51.100.2"},
		{"Garbage", "10.1.2.3:4000", []string{"not-an-address"}, "10.1.2.3"},
		{"OnlyProxies", "10.1.2.3:4000", []string{"10.0.0.1"}, "10.1.2.3"},
		{"IPv6Client", "10.1.2.3:4000", []string{"2001:db8::1"}, "2001:db8::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := clientAddr(r, proxies); got != tc.want {
				t.Errorf("clientAddr(%s, %q) = %s, want %s", tc.peer, tc.xff, got, tc.want)
			}
		})
	}
}

// The public rate limit over real connections: behind a configured proxy
// (127.0.0.1 here) each client X-Forwarded-For names has a bucket of its
// own; from a peer that is not a proxy the header is ignored, so a client
// that spoofs it still shares its own address's bucket.
func TestAdmit_RateByForwardedFor(t *testing.T) {
	inv := &blockingInventory{entered: make(chan struct{}, 64), release: make(chan struct{})}
	close(inv.release)
	for _, tc := range []struct {
		name    string
		proxies []netip.Prefix
		want    []bool // admitted, per call of clients a, b, a
	}{
		{"BehindAProxy", []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, []bool{true, true, false}},
		{"SpoofedFromANonProxy", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, []bool{true, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, _ := serveAdmitted(t, AdmitConfig{PerClient: 1, TrustedProxies: tc.proxies}, inv)
			client := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base)
			for i, from := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.1"} {
				req := connect.NewRequest(&v1.GetStockRequest{Sku: "s"})
				req.Header().Set("X-Forwarded-For", from)
				_, err := client.GetStock(context.Background(), req)
				if admitted := err == nil; admitted != tc.want[i] || (err != nil && wire.Reason(err) != string(stock.CodeRateLimited)) {
					t.Errorf("call %d from %s = %v, want admitted %v (else RATE_LIMITED)", i, from, err, tc.want[i])
				}
			}
		})
	}
}

// Bounds of TestAdmit_SlowLargeBodies.
const (
	slowConns        = 40
	slowStreams      = 100 // per connection
	slowBodyBytes    = 65_000
	slowRSSGrowthMax = 64 << 20
	// The attack is held until the server's memory has not grown for
	// slowSettled, at least slowAttackHold and at most slowAttackHoldMax.
	slowAttackHold    = 2 * time.Second
	slowSettled       = time.Second
	slowAttackHoldMax = 6 * time.Second
	slowHonestLatency = 2 * time.Second
	// slowAttackURL, in its environment, makes the test binary the
	// attacker of TestAdmit_SlowLargeBodies (a process of its own, so
	// that the server's memory is measured alone).
	slowAttackURL = "SHARDSTOCK_TEST_SLOW_ATTACK_URL"
)

// Many connections with many streams each, every stream sending a large
// message and never finishing it, from another process: the bytes read
// ahead stay under AheadBytes (the server's resident memory grows by less
// than slowRSSGrowthMax), and another client is still served, at once.
// Without the bound, the server would read 4,000 x 65,000 bytes (about
// 250 MiB) ahead.
func TestAdmit_SlowLargeBodies(t *testing.T) {
	if u := os.Getenv(slowAttackURL); u != "" {
		slowAttack(u)
		return
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc/self/status for the resident memory")
	}
	path, h := shardstockv1connect.NewInventoryServiceHandler(okInventory{})
	base := serveH2C(t, path, Admit(AdmitConfig{InFlight: 4096, BodyTimeout: 2 * slowAttackHoldMax, AheadBytes: 8 << 20}, h, nil))
	before := residentBytes(t)

	attacker := exec.Command(os.Args[0], "-test.run=^TestAdmit_SlowLargeBodies$")
	attacker.Env = append(os.Environ(), slowAttackURL+"="+base)
	stdin, err := attacker.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	attacker.Stdout, attacker.Stderr = &out, &out
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	// Sampled until it settles, or passes its bound, or time runs out.
	peak, began, settled := before, time.Now(), time.Now()
	for held := time.Duration(0); held < slowAttackHoldMax && peak-before <= slowRSSGrowthMax; held = time.Since(began) {
		time.Sleep(100 * time.Millisecond)
		if rss := residentBytes(t); rss > peak+1<<20 {
			peak, settled = rss, time.Now()
		}
		if held >= slowAttackHold && time.Since(settled) >= slowSettled {
			break
		}
	}
	held := time.Since(began)
	honest := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base)
	start := time.Now()
	_, err = honest.GetStock(context.Background(), connect.NewRequest(&v1.GetStockRequest{Sku: "s"}))
	took := time.Since(start)
	stdin.Close() // the attacker ends
	if werr := attacker.Wait(); werr != nil {
		t.Errorf("the attacker: %v\n%s", werr, out.String())
	}
	if err != nil || took > slowHonestLatency {
		t.Errorf("an honest GetStock during the attack = %v after %s, want served within %s", err, took, slowHonestLatency)
	}
	if grown := peak - before; grown > slowRSSGrowthMax {
		t.Errorf("resident memory grew by %d MiB under %d slow streams of %d bytes, want under %d MiB", grown>>20, slowConns*slowStreams, slowBodyBytes, slowRSSGrowthMax>>20)
	}
	t.Logf("server's resident memory %d MiB before, %d MiB at most with %d slow streams held %s; honest call in %s; attacker: %s",
		before>>20, peak>>20, slowConns*slowStreams, held.Round(time.Millisecond), took, strings.TrimSpace(out.String()))
}

// slowAttack is the attacker's side: slowConns connections of slowStreams
// streams each, every one sending slowBodyBytes of a message and then
// nothing, until stdin closes; it prints the answers it got by status.
func slowAttack(base string) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	body := strings.Repeat("x", slowBodyBytes)
	for range slowConns {
		hc := transport.NewClient() // a connection of its own
		for range slowStreams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pr, pw := io.Pipe()
				go func() {
					if _, err := io.WriteString(pw, body); err == nil {
						<-ctx.Done()
					}
					pw.CloseWithError(ctx.Err())
				}()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+shardstockv1connect.InventoryServiceDeductProcedure, pr)
				req.Header.Set("Content-Type", "application/proto")
				resp, err := hc.Do(req)
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	fmt.Printf("answers by HTTP status before it ended: %v\n", codes)
}

// residentBytes is this process's resident memory (VmRSS).
func residentBytes(t *testing.T) int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal(fmt.Errorf("no VmRSS in /proc/self/status"))
	return 0
}
