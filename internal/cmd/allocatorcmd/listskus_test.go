package allocatorcmd_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

// bulkSKUs is how many SKUs TestRun_ListSkus writes straight into its
// three databases (the API's CreateSku takes the placement lock for each,
// far too slow for a test of ten thousand).
const bulkSKUs = 10_000

// bulkName is the i-th bulk SKU's name; bulkDB the database it is written to:
// neighbours by name sit in different databases, so every page merges all
// three.
func bulkName(i int) string { return fmt.Sprintf("bulk-%05d", i) }
func bulkDB(i int) int      { return i % 3 }

// insertBulk writes the bulk SKUs of database d, each with one shard of
// 10 units, in one statement each for the SKUs and their shards.
func insertBulk(t *testing.T, url string, d int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var names []string
	var parts []int32
	for i := range bulkSKUs {
		if bulkDB(i) == d {
			names, parts = append(names, bulkName(i)), append(parts, stock.PartitionOf(bulkName(i), 0))
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO skus (sku, shards, shard_span, reservation_ttl_ms) SELECT unnest($1::text[]), 1, 1, 60000`, names); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO shards (sku, idx, partition, available, reserved, sold, opening_available)
		SELECT n, 0, p, 10, 0, 0, 10 FROM unnest($1::text[], $2::int[]) AS u(n, p)`, names, parts); err != nil {
		t.Fatal(err)
	}
}

// TestRun_ListSkus: ListSkus over three databases and 10,000 SKUs pages
// through every one, in order, none missing or repeated, while SKUs are
// being created through the API between them; hostile page tokens and a bad
// prefix or status are refused INVALID_ARGUMENT.
func TestRun_ListSkus(t *testing.T) {
	ctx := context.Background()
	urls := []string{pgtest.NewMigratedDB(t), pgtest.NewMigratedDB(t), pgtest.NewMigratedDB(t)}
	base, _ := startOn(t, urls[0], "-databases", "b="+urls[1]+",c="+urls[2])
	var wg sync.WaitGroup
	for d, url := range urls {
		wg.Go(func() { insertBulk(t, url, d) }) // after start: it migrated them
	}
	wg.Wait()
	admin := shardstockv1connect.NewAdminServiceClient(transport.NewClient(), base)

	// SKUs created while the listing pages, named among the bulk ones.
	stop := make(chan struct{})
	var created atomic.Int32
	wg.Go(func() {
		for i := 0; ; i += 37 {
			select {
			case <-stop:
				return
			default:
			}
			name := bulkName(i%bulkSKUs) + "-new"
			if _, err := admin.CreateSku(ctx, adminReq(&v1.CreateSkuRequest{Sku: name, InitialStock: 1, Shards: 1})); err != nil {
				t.Errorf("CreateSku(%s) = %v", name, err)
				return
			}
			created.Add(1)
		}
	})
	seen := map[string]int{}
	began := time.Now()
	var last, tok string
	pages := 0
	for {
		resp, err := admin.ListSkus(ctx, adminReq(&v1.ListSkusRequest{Prefix: "bulk-", PageSize: 700, PageToken: tok}))
		if err != nil {
			t.Fatalf("ListSkus(page %d) = %v", pages, err)
		}
		pages++
		for _, s := range resp.Msg.GetSkus() {
			name := s.GetSku().GetSku()
			if name <= last {
				t.Fatalf("ListSkus page %d lists %s after %s, want ascending names", pages, name, last)
			}
			last = name
			seen[name]++
			if !strings.HasSuffix(name, "-new") && (s.GetAvailable() != 10 || s.GetDatabase() != []string{"main", "b", "c"}[bulkDB(int(mustIndex(t, name)))]) {
				t.Errorf("ListSkus lists %s with available %d in %q, want 10 in the database it was written to", name, s.GetAvailable(), s.GetDatabase())
			}
		}
		if tok = resp.Msg.GetNextPageToken(); tok == "" {
			break
		}
	}
	close(stop)
	wg.Wait()
	for i := range bulkSKUs {
		if seen[bulkName(i)] != 1 {
			t.Fatalf("ListSkus listed %s %d times, want once", bulkName(i), seen[bulkName(i)])
		}
	}
	if created.Load() == 0 {
		t.Errorf("no SKU was created while ListSkus paged: the test proved nothing about a listing under creation")
	}
	t.Logf("%d pages, %d SKUs listed in %s, %d created while paging", pages, len(seen), time.Since(began), created.Load())

	t.Run("HostileTokens", func(t *testing.T) {
		first, err := admin.ListSkus(ctx, adminReq(&v1.ListSkusRequest{Prefix: "bulk-", PageSize: 2}))
		if err != nil {
			t.Fatal(err)
		}
		enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
		for _, tc := range []struct {
			name string
			req  *v1.ListSkusRequest
		}{
			{"NotBase64", &v1.ListSkusRequest{PageToken: "%%%"}},
			{"Garbage", &v1.ListSkusRequest{PageToken: enc("garbage")}},
			{"OtherVersion", &v1.ListSkusRequest{PageToken: enc("2\x00\x00\x00bulk-00001")}},
			{"BadSKU", &v1.ListSkusRequest{PageToken: enc("1\x00\x00\x00bulk'; DROP TABLE skus")}},
			{"OtherPrefix", &v1.ListSkusRequest{Prefix: "bulk-0", PageToken: first.Msg.GetNextPageToken()}},
			{"OtherStatus", &v1.ListSkusRequest{Prefix: "bulk-", Status: v1.SkuStatus_SKU_STATUS_PAUSED, PageToken: first.Msg.GetNextPageToken()}},
			{"OutsidePrefix", &v1.ListSkusRequest{Prefix: "bulk-", PageToken: enc("1\x00bulk-\x00\x00zzz")}},
			{"Huge", &v1.ListSkusRequest{PageToken: strings.Repeat("A", 4096)}},
			{"BadPrefix", &v1.ListSkusRequest{Prefix: "bulk %"}},
			{"BadStatus", &v1.ListSkusRequest{Status: 7}},
		} {
			_, err := admin.ListSkus(ctx, adminReq(tc.req))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || wire.Reason(err) != string(stock.CodeInvalidArgument) {
				t.Errorf("ListSkus(%s) = %v, want invalid_argument, reason INVALID_ARGUMENT", tc.name, err)
			}
		}
		if _, err := admin.ListSkus(ctx, connect.NewRequest(&v1.ListSkusRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("ListSkus without the admin token = %v, want unauthenticated", err)
		}
	})
}

// mustIndex is the number in a bulk SKU's name.
func mustIndex(t *testing.T, name string) int64 {
	t.Helper()
	var i int64
	if _, err := fmt.Sscanf(name, "bulk-%05d", &i); err != nil {
		t.Fatalf("%s is not a bulk name: %v", name, err)
	}
	return i
}
