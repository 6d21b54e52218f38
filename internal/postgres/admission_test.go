package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestDB_AdmissionLockWaitersLeaveConnections: an entry batch holds its
// SKU's admission lock and reads the stock on a second connection of the
// same pool while more ticket calls of the SKU than the pool has
// connections wait for that lock. The read must get its connection: the
// waiters queue for one of the pool's lock places without holding a
// connection. Were they each holding one (a pool of 4: the holder and
// three waiters), the read would wait until its deadline, and every ticket
// of the SKU with it.
func TestDB_AdmissionLockWaitersLeaveConnections(t *testing.T) {
	ctx := context.Background()
	db, err := postgres.Open(ctx, pgtest.NewMigratedDB(t), postgres.Options{MaxConns: 4, ApplicationName: "lock-waiters"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const sku = "lock-waiters"
	entry := func(key string) []stock.TicketEntry {
		return []stock.TicketEntry{{Ticket: stock.Ticket{SKU: sku, Quantity: 1, IdempotencyKey: key}, Params: []byte(key)}}
	}
	plenty := func(context.Context) (int64, bool, error) { return 10, false, nil }
	first, err := db.EnterTickets(ctx, sku, entry("first"), 10, 0, plenty)
	if err != nil || first[0].Err != nil {
		t.Fatalf("EnterTickets(first) = %v, %v", first, err)
	}
	id := first[0].Ticket.ID

	const waiters = 3 // with the holder, the whole pool
	var wg sync.WaitGroup
	defer wg.Wait()
	read := func(ctx context.Context) (int64, bool, error) {
		// Under the lock: the waiters queue behind it, then the stock is
		// read as Availability would, on the pool.
		for range waiters {
			wg.Go(func() { db.CancelTicket(ctx, id) })
		}
		time.Sleep(500 * time.Millisecond)
		readCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := db.WaitingCount(readCtx, sku); err != nil {
			return 0, false, err
		}
		return 10, false, nil
	}
	began := time.Now()
	got, err := db.EnterTickets(ctx, sku, entry("second"), 10, 0, read)
	if err != nil || got[0].Err != nil {
		t.Fatalf("EnterTickets(second) with %d calls waiting for the lock = %v, %v after %v; want a ticket: the stock read found no connection",
			waiters, got, err, time.Since(began).Round(time.Millisecond))
	}
}
