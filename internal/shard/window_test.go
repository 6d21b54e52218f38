package shard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/stock"
)

// saleProbe is one deduct of TestShard_SaleWindow with the database's
// clock read just before it was sent and just after it was answered: the
// batch that decided it read its now() in between.
type saleProbe struct {
	res           stock.Result
	before, after time.Time
}

// TestShard_SaleWindow: a window that opens 2 s after it is set refuses
// every deduct SALE_NOT_STARTED (with the start in the metadata) until the
// database's clock reaches the start, sells from then on, and refuses
// SALE_ENDED from the end, by the database's clock, while the shard
// server's estimate of that clock (SkewClock) is put on the other side of
// each bound: speculative groups the database refused prove the two
// clocks disagreed on the requests that were answered by the database's.
func TestShard_SaleWindow(t *testing.T) {
	t.Parallel() // its own database and servers; no fault or timing a neighbour could upset
	ctx := context.Background()
	db, url := openDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	s := newServer(t, db, "s1")
	const sku = "window"
	createSKU(t, db, stock.SKU{Name: sku, Shards: 1}, 1000)
	acquire(t, s, sku, 1, 0)
	n := 0
	// probe sends a deduct with the server's estimate of the database's
	// clock moved to about estimate.
	probe := func(estimate time.Time) saleProbe {
		t.Helper()
		n++
		p := saleProbe{before: dbNow()}
		db.SkewClock(estimate.Sub(p.before))
		p.res = s.Do(ctx, &stock.Request{Kind: stock.OpDeduct, Shard: stock.ShardKey{SKU: sku}, Quantity: 1, Key: fmt.Sprintf("k-%04d", n)})
		p.after = dbNow()
		return p
	}
	if r := probe(dbNow()); r.res.Err != nil {
		t.Fatalf("Deduct before any window = %v, want success", r.res.Err)
	}

	start := dbNow().Add(2 * time.Second).Truncate(time.Microsecond)
	if _, err := db.UpdateSKU(ctx, sku, stock.SKUUpdate{SaleStart: &start}); err != nil {
		t.Fatal(err)
	}
	// The first deduct learns the window (its writer's copy of the SKU had
	// none); from then on each is speculated inside the window.
	if r := probe(start.Add(time.Hour)); stock.CodeOf(r.res.Err) != stock.CodeSaleNotStarted {
		t.Fatalf("Deduct 2 s before the start = %v, want SALE_NOT_STARTED", r.res.Err)
	}
	_, fellBack0 := db.Speculated()
	refused := 0
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := probe(start.Add(time.Hour))
		if r.res.Err == nil {
			if r.after.Before(start) {
				t.Fatalf("Deduct answered at %s, before the start %s by the database's clock, sold", r.after, start)
			}
			break
		}
		if stock.CodeOf(r.res.Err) != stock.CodeSaleNotStarted || !r.before.Before(start) {
			t.Fatalf("Deduct sent at %s (start %s) = %v, want SALE_NOT_STARTED before the start and a sale after", r.before, start, r.res.Err)
		}
		if got, want := r.res.Err.Metadata[stock.MetaSaleStart], start.UTC().Format(time.RFC3339Nano); got != want {
			t.Fatalf("SALE_NOT_STARTED metadata %s = %q, want %q", stock.MetaSaleStart, got, want)
		}
		refused++
		if time.Now().After(deadline) {
			t.Fatalf("no sale within 10 s of a start 2 s away")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, fellBack1 := db.Speculated()
	if refused == 0 || fellBack1 == fellBack0 {
		t.Fatalf("%d refusals, %d speculative groups refused by the database: the estimate never disagreed with the database's clock", refused, fellBack1-fellBack0)
	}
	// Inside the window with the estimate before it: the database sells.
	for range 3 {
		if r := probe(start.Add(-time.Hour)); r.res.Err != nil {
			t.Fatalf("Deduct inside the window, estimated before it = %v, want success", r.res.Err)
		}
	}

	end := dbNow().Add(time.Second).Truncate(time.Microsecond)
	if _, err := db.UpdateSKU(ctx, sku, stock.SKUUpdate{SaleEnd: &end}); err != nil {
		t.Fatal(err)
	}
	inside := start.Add(end.Sub(start) / 2)
	sold := 0
	for {
		r := probe(inside)
		if r.res.Err == nil {
			if !r.before.Before(end) {
				t.Fatalf("Deduct sent at %s, after the end %s by the database's clock, sold", r.before, end)
			}
			sold++
		} else {
			if stock.CodeOf(r.res.Err) != stock.CodeSaleEnded || r.after.Before(end) {
				t.Fatalf("Deduct answered at %s (end %s) = %v, want a sale before the end and SALE_ENDED after", r.after, end, r.res.Err)
			}
			if got, want := r.res.Err.Metadata[stock.MetaSaleEnd], end.UTC().Format(time.RFC3339Nano); got != want {
				t.Fatalf("SALE_ENDED metadata %s = %q, want %q", stock.MetaSaleEnd, got, want)
			}
			break
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("still selling 10 s after an end 1 s away")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, fellBack2 := db.Speculated()
	t.Logf("%d refused before the start, %d sold before the end; %d and %d speculative groups refused by the database's clock",
		refused, sold, fellBack1-fellBack0, fellBack2-fellBack1)
	if got := total(t, db, sku); got.Sold != int64(1+3+sold+1) || got.Available != 1000-got.Sold {
		t.Errorf("counts %+v, want %d sold", got, 1+3+sold+1)
	}
	reconcile(t, db, sku)
}
