package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/shardstock/shardstock/internal/freeport"
)

// etcdCluster is a 3-member embedded etcd of a test's own.
type etcdCluster struct {
	members []*embed.Etcd
	clients []string // each member's client URL
}

// startEtcdCluster starts n members on ports of 127.0.0.1 and waits until
// they serve; they stop at cleanup.
func startEtcdCluster(t *testing.T, n int) *etcdCluster {
	t.Helper()
	c := &etcdCluster{}
	var peers, initial []string
	for i := range n {
		pp, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		cp, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, fmt.Sprintf("http://127.0.0.1:%d", pp))
		c.clients = append(c.clients, fmt.Sprintf("http://127.0.0.1:%d", cp))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		pu, _ := url.Parse(peers[i])
		cu, _ := url.Parse(c.clients[i])
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "e2e"
		cfg.LogLevel = "panic"
		cfg.UnsafeNoFsync = true
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			t.Fatalf("etcd member %d: %v", i, err)
		}
		c.members = append(c.members, e)
		t.Cleanup(e.Close)
	}
	for i, e := range c.members {
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(startTimeout):
			t.Fatalf("etcd member %d not ready", i)
		}
	}
	return c
}

// leader returns the index of the member that leads now.
func (c *etcdCluster) leader(t *testing.T) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for i, e := range c.members {
			if e.Server.Leader() != 0 && e.Server.Leader() == e.Server.MemberID() {
				return i
			}
		}
	}
	t.Fatal("no etcd leader within 10 s")
	return -1
}

// TestE2E_EtcdLeaderLost: the recorded-history run on a stack whose etcd
// is a 3-member cluster, whose leader is stopped mid-sale (the two others
// elect a new one). Partition ownership and leases must survive it: the
// history is checked by checkHistory.
func TestE2E_EtcdLeaderLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	c := startEtcdCluster(t, 3)
	s := newStackOpts(t, stackOpts{shardServers: 3, etcd: strings.Join(c.clients, ",")})
	const sku = "etcdlost"
	s.createSKU(sku, linStock, 8)

	var lost int64
	var newLeader int
	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		i := c.leader(t)
		lost = since()
		// The leader stops without a word to the others (no leadership
		// transfer); two members keep a quorum and elect a new one.
		c.members[i].Server.HardStop()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			for j, e := range c.members {
				if j != i && e.Server.Leader() != 0 && e.Server.Leader() == e.Server.MemberID() {
					newLeader = j
					return
				}
			}
		}
		t.Errorf("no new etcd leader within 10 s of losing member %d", i)
	})
	checkHistory(t, s, sku, h, lost, fmt.Sprintf("the etcd leader lost at %s (member %d leads now)", time.Duration(lost).Round(time.Millisecond), newLeader))
}
