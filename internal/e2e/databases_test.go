package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestE2E_TwoDatabases: SKUs placed on two Postgres clusters of their own.
// New SKUs spread over both; the source document's case holds on a SKU of
// each, at once; one key on two SKUs of one database and on a SKU of the
// other is an operation on each; with one cluster crashed its SKUs answer a retryable
// unavailable while the other's keep selling, every sale acknowledged
// exactly once; once it is back its SKUs sell again, and every SKU's books
// balance.
func TestE2E_TwoDatabases(t *testing.T) {
	ctx := context.Background()
	clusters := map[string]*pgcluster.Cluster{}
	for _, name := range []string{stock.DefaultDatabase, "second"} {
		clusters[name] = startCluster(ctx, t)
	}
	s := newStackOpts(t, stackOpts{shardServers: 2, dbURL: clusters["main"].URL(),
		env: []string{"SHARDSTOCK_DATABASES=second=" + clusters["second"].URL()}})

	topo, err := s.admin.GetTopology(ctx, adminReq(&v1.GetTopologyRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if pl := topo.Msg.Placement; pl == nil || len(pl.Databases) != 2 || pl.Databases[0].Slots != 512 || !pl.Databases[1].Configured {
		t.Fatalf("GetTopology placement = %v, want main and second with 512 slots each", pl)
	}

	// Twenty SKUs: each in the database the placement names, and only there.
	placement, err := stock.Placement{}.Next([]string{"main", "second"})
	if err != nil {
		t.Fatal(err)
	}
	on := map[string][]string{}
	for i := range 20 {
		name := fmt.Sprintf("sku-%02d", i)
		s.createSKU(name, 100, 4)
		on[placement.Newest(name)] = append(on[placement.Newest(name)], name)
	}
	for db, names := range on {
		for _, name := range names {
			for other, c := range clusters {
				if n := countSKU(t, c.URL(), name); n != map[bool]int{true: 1, false: 0}[other == db] {
					t.Fatalf("%s: %d rows in database %s; placed on %s", name, n, other, db)
				}
			}
		}
	}
	if len(on["main"]) == 0 || len(on["second"]) == 0 {
		t.Fatalf("SKUs spread %v, want some on each database", on)
	}
	onMain, onSecond := on["main"][0], on["second"][0]

	// The source document's case on one SKU of each database, at once.
	var wg sync.WaitGroup
	for _, name := range []string{onMain, onSecond} {
		wg.Go(func() { sourceCase(t, s, name) })
	}
	wg.Wait()

	// An operation is identified by (sku, idempotency_key), wherever the
	// SKU lives: one key on two SKUs of main and one of second is three
	// operations, each replayed on retry, each read back as its own.
	if len(on["main"]) < 3 || len(on["second"]) < 4 {
		t.Fatalf("SKUs spread %v, want 3 on main and 4 on second", on)
	}
	shared := []string{on["main"][1], on["main"][2], on["second"][3]}
	for _, replayed := range []bool{false, true} {
		for _, name := range shared {
			resp, err := s.deduct(ctx, name, "shared-key", 1)
			if err != nil || resp.Replayed != replayed || resp.Operation.GetSku() != name {
				t.Errorf("Deduct(%s, shared-key) = %v, %v; want its own operation (replayed %v)", name, resp, err, replayed)
			}
		}
	}
	for _, name := range shared {
		resp, err := s.inv.GetOperation(ctx, connect.NewRequest(&v1.GetOperationRequest{Sku: name, IdempotencyKey: "shared-key"}))
		if err != nil || resp.Msg.Operation.GetSku() != name {
			t.Errorf("GetOperation(%s, shared-key) = %v, %v; want its own operation", name, resp, err)
		}
	}

	// Crash the second cluster: its SKUs are unavailable (retryable), the
	// main's keep selling, even on the partitions of a shard server killed
	// meanwhile, which the other takes over with one database down.
	if err := clusters["second"].Crash(); err != nil {
		t.Fatal(err)
	}
	s.shards["s1"].stop(syscall.SIGKILL)
	s.waitStable(startTimeout)
	var sold atomic.Int64
	parallel(t, 150, 60*time.Second, func(i int) {
		name := on["main"][1+i%(len(on["main"])-1)]
		if _, err := s.deduct(ctx, name, fmt.Sprintf("down-%d", i), 1); err != nil {
			t.Errorf("Deduct(%s) with the other database down = %v", name, err)
			return
		}
		sold.Add(1)
	})
	for _, name := range on["second"][1:3] {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := s.deduct(dctx, name, "while-down-"+name, 1)
		cancel()
		if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Errorf("Deduct(%s) with its database down = %v (%s), want unavailable", name, err, code)
		}
	}
	for _, name := range on["main"] {
		s.reconcile(name)
	}

	// Back: its SKUs sell again, and the retried keys are applied once.
	if err := clusters["second"].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range on["second"][1:3] {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := s.deduct(ctx, name, "while-down-"+name, 1)
			if err == nil {
				break
			}
			if time.Now().After(deadline) || connect.CodeOf(err) != connect.CodeUnavailable {
				t.Fatalf("Deduct(%s) after its database came back = %v", name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if st := s.stock(name); st.Sold != 1 {
			t.Errorf("%s: sold %d after one key retried until it succeeded, want 1", name, st.Sold)
		}
	}
	var total int64
	for _, names := range on {
		for _, name := range names {
			total += s.stock(name).Sold
			s.reconcile(name)
		}
	}
	if want := 200 + int64(len(shared)) + sold.Load() + 2; total != want {
		t.Errorf("sold %d over all SKUs, want %d (acknowledged)", total, want)
	}
}

// countSKU counts the rows of sku in the database at url.
func countSKU(t *testing.T, url, sku string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM skus WHERE sku = $1`, sku).Scan(&n); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return n
}
