package allocatorcmd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/transport"
)

// Bounds of TestRun_ExactlyOnceConsumer.
const (
	exampleDeducts    = 60                     // of 1 to 3 units each, at least
	exampleDeductsMax = 300                    // and on while the consumer is stopped and started, at most this many
	exampleStops      = 3                      // the consumer stopped, and started again, this many times
	exampleMoveMax    = 10 * time.Second       // each run, until it has committed something
	exampleRunOn      = 35 * time.Millisecond  // then it runs on i times this before its i-th stop
	exampleCatchUp    = 30 * time.Second       // after the deducts, until it has counted them all
	exampleLingerOK   = 500 * time.Millisecond // then, running on, it must count nothing more
)

// TestRun_ExactlyOnceConsumer runs the example consumer of
// docs/changestream.md ("A consumer that applies each entry exactly once",
// whose text is follow's below, checked here) against the allocator: it
// counts the units sold per SKU in a database of its own, committing the
// cursor with each effect. Stopped three times while deducts land, each
// time once it has committed something (its context cancelled, inside its
// transaction or not), and started again each time, it counts every unit
// once: at-least-once delivery, exactly-once processing.
func TestRun_ExactlyOnceConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	doc, err := os.ReadFile("../../../docs/changestream.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_consumer_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(doc), "```go\n")
	block, _, _ = strings.Cut(block, "```")
	if block == "" || !strings.Contains(string(src), block) {
		t.Fatalf("docs/changestream.md's example consumer is not follow's text in example_consumer_test.go:\n%s", block)
	}

	// A cluster of its own (the later -database-url wins): the stream waits
	// for the whole cluster's oldest transaction (docs/changestream.md).
	base, _ := start(t, "-shard-id", "own", "-lease-ttl", "2s", "-database-url", pgtest.NewPrivateDBs(t, 1)[0])
	if !ready(base, startTimeout) {
		t.Fatalf("/readyz not 200 within %s", startTimeout)
	}
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)
	inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base, bearer(serviceToken))
	if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: "counted", InitialStock: 1000, Shards: 4})); err != nil {
		t.Fatalf("CreateSku = %v", err)
	}
	db, err := pgxpool.New(ctx, pgtest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE sold (sku text PRIMARY KEY, units bigint NOT NULL);
		CREATE TABLE cursors (name text PRIMARY KEY, cursor text NOT NULL);
		INSERT INTO cursors VALUES ('sold', '')`); err != nil {
		t.Fatal(err)
	}
	counted := func() int64 {
		var units int64
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM sold`).Scan(&units); err != nil {
			t.Fatal(err)
		}
		return units
	}

	// The deducts land while the consumer is stopped and started again.
	deducted, stopped := make(chan int64, 1), make(chan struct{})
	go func() {
		var units int64
		defer func() { deducted <- units }()
		for i := range exampleDeductsMax {
			if i >= exampleDeducts {
				select {
				case <-stopped:
					return
				default:
				}
			}
			q := int64(1 + i%3)
			if _, err := inv.Deduct(ctx, connect.NewRequest(&v1.DeductRequest{Sku: "counted", Quantity: q, IdempotencyKey: fmt.Sprintf("d-%d", i)})); err != nil {
				t.Errorf("Deduct %d = %v", i, err)
				continue
			}
			units += q
			time.Sleep(20 * time.Millisecond)
		}
	}()
	run := func() (stop func()) {
		fctx, fcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- follow(fctx, db, admin, token) }()
		return func() {
			fcancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("follow = %v, want it cancelled", err)
			}
		}
	}
	cursor := func() string {
		var c string
		if err := db.QueryRow(ctx, `SELECT cursor FROM cursors WHERE name = 'sold'`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Each run is stopped once it has committed something (a fixed time
	// was too short on a loaded machine: a run that committed nothing tests
	// nothing), then after running on for a time that grows with each stop,
	// so that the stops land at different points of its transactions.
	moved := 0
	for i := range exampleStops {
		before := cursor()
		stop := run()
		for deadline := time.Now().Add(exampleMoveMax); cursor() == before && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(i) * exampleRunOn)
		stop()
		if cursor() != before {
			moved++
		}
	}
	close(stopped)
	if moved < exampleStops {
		t.Errorf("the consumer committed something before %d of its %d stops within %s each, want all: the others test nothing", moved, exampleStops, exampleMoveMax)
	}
	stop := run()
	defer stop()
	want := <-deducted
	for deadline := time.Now().Add(exampleCatchUp); counted() < want && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(exampleLingerOK)
	if got := counted(); got != want {
		t.Errorf("the consumer, stopped %d times, counted %d units sold, want the %d deducted", exampleStops, got, want)
	}
}

// Units sold per SKU, in the consumer's own database:
//
//	CREATE TABLE sold (sku text PRIMARY KEY, units bigint NOT NULL);
//	CREATE TABLE cursors (name text PRIMARY KEY, cursor text NOT NULL);
//	INSERT INTO cursors VALUES ('sold', '');
func follow(ctx context.Context, db *pgxpool.Pool, admin shardstockv1connect.AdminServiceClient, token string) error {
	for ctx.Err() == nil {
		var cursor string
		if err := db.QueryRow(ctx, `SELECT cursor FROM cursors WHERE name = 'sold'`).Scan(&cursor); err != nil {
			return err
		}
		req := connect.NewRequest(&v1.WatchLedgerRequest{Cursor: cursor, Consumer: "sold"})
		req.Header().Set("Authorization", "Bearer "+token)
		stream, err := admin.WatchLedger(ctx, req)
		if err != nil {
			return err
		}
		for stream.Receive() {
			m := stream.Msg()
			err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				if e := m.GetEntry(); e != nil && e.GetKind() == "deduct" {
					if _, err := tx.Exec(ctx, `INSERT INTO sold VALUES ($1, $2)
						ON CONFLICT (sku) DO UPDATE SET units = sold.units + $2`, e.GetSku(), e.GetQuantity()); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `UPDATE cursors SET cursor = $1 WHERE name = 'sold'`, m.GetCursor())
				return err
			})
			if err != nil {
				break // resume from the cursor committed last
			}
		}
		stream.Close()
		time.Sleep(time.Second) // CONSUMER_BEHIND, SHARD_UNAVAILABLE, a network error: resume
	}
	return ctx.Err()
}
