package e2e

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/transport"
)

// TestE2E_MutualTLS: shard servers that serve TLS and require a client
// certificate of the test's CA for the ShardService; the allocator
// presents one. Sales go through; a caller without a certificate, with one
// another CA signed, or in cleartext, cannot reach the ShardService of any
// shard server, while the probes stay open.
func TestE2E_MutualTLS(t *testing.T) {
	besideOthers(t)
	ca := cmdtest.NewCA(t)
	shardCert, shardKey := ca.Issue(t, "shard")
	allocCert, allocKey := ca.Issue(t, "allocator")
	// Postgres too serves TLS only, and every process verifies it.
	pgCert, pgKey := ca.Issue(t, "postgres")
	pg, err := pgcluster.StartTLS(context.Background(), "", pgcluster.TLS{CertFile: pgCert, KeyFile: pgKey, CAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	s := newStackOpts(t, stackOpts{shardServers: 2, dbURL: pg.URL(),
		env: []string{"SHARDSTOCK_TLS_CERT=" + shardCert, "SHARDSTOCK_TLS_KEY=" + shardKey, "SHARDSTOCK_TLS_CLIENT_CA=" + ca.File},
		allocEnv: []string{"SHARDSTOCK_TLS_CERT=", "SHARDSTOCK_TLS_KEY=",
			"SHARDSTOCK_SHARD_TLS_CERT=" + allocCert, "SHARDSTOCK_SHARD_TLS_KEY=" + allocKey, "SHARDSTOCK_SHARD_TLS_CA=" + ca.File}})
	s.createSKU("mtls", 10, 4)
	for i := range 10 {
		if _, err := s.deduct(context.Background(), "mtls", "mtls-"+string(rune('a'+i)), 1); err != nil {
			t.Fatalf("Deduct over mTLS to the shard servers = %v", err)
		}
	}
	if _, err := s.deduct(context.Background(), "mtls", "mtls-more", 1); reason(err) != "OUT_OF_STOCK" {
		t.Errorf("Deduct after selling out = %v, want OUT_OF_STOCK", err)
	}
	s.reconcile("mtls")
	// Every process reached Postgres over TLS (the cluster refuses
	// anything else): count their connections.
	conn, err := pgx.Connect(context.Background(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tlsConns, plain int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()`).Scan(&tlsConns, &plain); err != nil {
		t.Fatal(err)
	}
	if tlsConns < 3 || plain != 0 {
		t.Errorf("Postgres has %d TLS and %d cleartext connections of the stack, want at least 3 (two shard servers, an allocator) and none", tlsConns, plain)
	}

	// Every shard server: no certificate, no ShardService; cleartext, no
	// answer at all; the probes answer anyone who trusts the server.
	topo, err := s.admin.GetTopology(context.Background(), adminReq(&v1.GetTopologyRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP2(true)
	anonymous := &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}, Timeout: 5 * time.Second}
	// A caller whose certificate another CA signed, named as an allocator.
	rogueCert, rogueKey := cmdtest.NewCA(t).Issue(t, "allocator")
	rogue, err := tls.LoadX509KeyPair(rogueCert, rogueKey)
	if err != nil {
		t.Fatal(err)
	}
	wronglySigned := &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{rogue}}}, Timeout: 5 * time.Second}
	for _, srv := range topo.Msg.Servers {
		steal := &v1.ExecuteRequest{Ops: []*v1.ShardOp{{Kind: v1.ShardOpKind_SHARD_OP_KIND_ADJUST, Sku: "mtls", Quantity: 1000, Reason: "x", Approver: "y", IdempotencyKey: "steal-signed", Source: "admin:thief"}}}
		if _, err := shardstockv1connect.NewShardServiceClient(wronglySigned, "https://"+srv.Address).Execute(context.Background(), connect.NewRequest(steal)); err == nil {
			t.Errorf("%s: Execute with a certificate of another CA = nil error, want refused", srv.ServerId)
		}
		base := "https://" + srv.Address
		sc := shardstockv1connect.NewShardServiceClient(anonymous, base)
		_, err := sc.Execute(context.Background(), connect.NewRequest(&v1.ExecuteRequest{Ops: []*v1.ShardOp{{Kind: v1.ShardOpKind_SHARD_OP_KIND_ADJUST, Sku: "mtls", Quantity: 1000, Reason: "x", Approver: "y", IdempotencyKey: "steal", Source: "admin:thief"}}}))
		if err == nil {
			t.Errorf("%s: Execute without a client certificate = nil error, want refused", srv.ServerId)
		}
		resp, err := anonymous.Get(base + "/readyz")
		if err != nil {
			t.Errorf("%s: /readyz over TLS without a certificate = %v, want answered", srv.ServerId, err)
		} else {
			resp.Body.Close()
		}
		plain := shardstockv1connect.NewShardServiceClient(transport.NewClient(), "http://"+srv.Address)
		if _, err := plain.Execute(context.Background(), connect.NewRequest(&v1.ExecuteRequest{})); err == nil {
			t.Errorf("%s: a cleartext Execute was answered", srv.ServerId)
		}
	}
	if st := s.stock("mtls"); st.Available != 0 || st.Sold != 10 {
		t.Errorf("stock %v after the refused calls, want 0 available, 10 sold", st)
	}
	if !strings.HasPrefix(s.base, "http://") {
		t.Errorf("the public port %s: it stays as configured (cleartext here)", s.base)
	}
}
