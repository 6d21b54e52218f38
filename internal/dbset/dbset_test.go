package dbset

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newSet opens databases named names (each a fresh database) and a Set
// over them whose first placement spreads SKUs over first.
func newSet(t *testing.T, names []string, first []string) (*Set, map[string]*postgres.DB) {
	t.Helper()
	s, dbs, _ := newSetAt(t, names, first)
	return s, dbs
}

// newSetAt is newSet, with the endpoints of the Set's etcd.
func newSetAt(t *testing.T, names []string, first []string) (*Set, map[string]*postgres.DB, []string) {
	t.Helper()
	ctx := context.Background()
	dbs := map[string]*postgres.DB{}
	for _, name := range names {
		db, err := postgres.Open(ctx, pgtest.NewMigratedDB(t), postgres.Options{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		dbs[name] = db
	}
	e := etcdtest.Start(t)
	return openSet(t, dbs, e.Endpoints(), first), dbs, e.Endpoints()
}

func sku(name string) stock.SKU {
	return stock.SKU{Name: name, Status: stock.StatusActive, Shards: 2, ShardSpan: 2, AutoShards: true, ReservationTTL: time.Minute}
}

// where reports which databases hold sku.
func where(t *testing.T, dbs map[string]*postgres.DB, name string) []string {
	t.Helper()
	var out []string
	for _, n := range []string{"a", "b", "c"} {
		if db := dbs[n]; db != nil {
			if _, err := db.GetSKU(context.Background(), name); err == nil {
				out = append(out, n)
			} else if stock.CodeOf(err) != stock.CodeSKUNotFound {
				t.Fatal(err)
			}
		}
	}
	return out
}

// SKUs are spread over the databases by the newest placement; a new
// version sends new SKUs to the new database and moves none of the old,
// which are still found (and served) where they were created; a SKU name
// is never created twice across databases.
func TestSet_PlacementVersions(t *testing.T) {
	ctx := context.Background()
	s, dbs := newSet(t, []string{"a", "b", "c"}, []string{"a", "b"})
	const n = 60
	for i := range n {
		if err := s.CreateSKU(ctx, sku(fmt.Sprintf("old-%d", i)), 10); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for i := range n {
		name := fmt.Sprintf("old-%d", i)
		w := where(t, dbs, name)
		if len(w) != 1 || w[0] != s.Placement().Newest(name) {
			t.Fatalf("%s is in %v, want only %s", name, w, s.Placement().Newest(name))
		}
		count[w[0]]++
	}
	if count["a"] < 15 || count["b"] < 15 || count["c"] != 0 {
		t.Fatalf("first version spread %v, want about half each on a and b", count)
	}

	if _, err := s.SetPlacement(ctx, []string{"a", "b", "nope"}); stock.CodeOf(err) != stock.CodeInvalidArgument {
		t.Fatalf("SetPlacement with an unconfigured database = %v, want INVALID_ARGUMENT", err)
	}
	p, err := s.SetPlacement(ctx, []string{"a", "b", "c"})
	if err != nil || p.Version() != 2 {
		t.Fatalf("SetPlacement = v%d, %v", p.Version(), err)
	}
	moved := 0
	for i := range n {
		name := fmt.Sprintf("old-%d", i)
		if len(p.Candidates(name)) > 1 {
			moved++
		}
		got, err := s.GetSKU(ctx, name)
		if err != nil || got.Name != name {
			t.Fatalf("GetSKU(%s) after a new version = %v, %v", name, got, err)
		}
		if w := where(t, dbs, name); len(w) != 1 {
			t.Fatalf("%s is in %v after a new version: no SKU moves", name, w)
		}
		// Creating it again is refused wherever the new version would put it.
		if err := s.CreateSKU(ctx, sku(name), 10); stock.CodeOf(err) != stock.CodeSKUExists {
			t.Fatalf("CreateSKU(%s) again = %v, want SKU_ALREADY_EXISTS", name, err)
		}
		if w := where(t, dbs, name); len(w) != 1 {
			t.Fatalf("%s is in %v after a second CreateSKU", name, w)
		}
	}
	if moved == 0 {
		t.Fatal("no old SKU's slot changed database: the test tests nothing")
	}
	onC := 0
	for i := range n {
		name := fmt.Sprintf("new-%d", i)
		if err := s.CreateSKU(ctx, sku(name), 10); err != nil {
			t.Fatal(err)
		}
		if w := where(t, dbs, name); len(w) != 1 || w[0] != p.Newest(name) {
			t.Fatalf("%s is in %v, want %s", name, w, p.Newest(name))
		} else if w[0] == "c" {
			onC++
		}
	}
	if onC == 0 {
		t.Fatal("no new SKU went to the new database")
	}
	if _, err := s.GetSKU(ctx, "never-created"); stock.CodeOf(err) != stock.CodeSKUNotFound {
		t.Fatalf("GetSKU of an unknown SKU = %v, want SKU_NOT_FOUND", err)
	}
}

// ListTransfers without a SKU merges every database's transfers in
// creation order, and pages across them without loss or repeat.
func TestSet_ListTransfersAcrossDatabases(t *testing.T) {
	ctx := context.Background()
	s, _ := newSet(t, []string{"a", "b"}, []string{"a", "b"})
	var skus []string
	dbsOf := map[string]int{}
	for i := 0; dbsOf["a"] < 2 || dbsOf["b"] < 2; i++ {
		name := fmt.Sprintf("t-%d", i)
		if db := s.Placement().Newest(name); dbsOf[db] < 2 {
			if err := s.CreateSKU(ctx, sku(name), 100); err != nil {
				t.Fatal(err)
			}
			skus = append(skus, name)
			dbsOf[db]++
		}
	}
	want := map[string]bool{}
	for i := range 12 {
		name := skus[i%len(skus)]
		id := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		if err := s.CreateTransfer(ctx, &stock.Transfer{ID: id, SKU: name, From: 0, To: 1, Quantity: 1, Reason: "refill"}); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	got := map[string]bool{}
	after := ""
	for page := 0; page < 10; page++ {
		ts, err := s.ListTransfers(ctx, stock.TransferFilter{}, after, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) == 0 {
			break
		}
		for i, tr := range ts {
			if got[tr.ID] {
				t.Fatalf("transfer %s listed twice", tr.ID)
			}
			got[tr.ID] = true
			if i > 0 && tr.CreatedAt.Before(ts[i-1].CreatedAt) {
				t.Fatalf("page %d out of creation order", page)
			}
		}
		after = ts[len(ts)-1].ID
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d transfers over the databases %v, want %d", len(got), dbsOf, len(want))
	}
}

// TestSet_GetSKUs: SKUs on two databases are read from each, in one
// call; a name no database has is left out.
func TestSet_GetSKUs(t *testing.T) {
	ctx := context.Background()
	s, _ := newSet(t, []string{"a", "b"}, []string{"a", "b"})
	var names []string
	dbsOf := map[string]int{}
	for i := 0; dbsOf["a"] < 2 || dbsOf["b"] < 2; i++ {
		name := fmt.Sprintf("g-%d", i)
		if db := s.Placement().Newest(name); dbsOf[db] < 2 {
			if err := s.CreateSKU(ctx, sku(name), 100); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
			dbsOf[db]++
		}
	}
	got, err := s.GetSKUs(ctx, append(slices.Clone(names), "nowhere"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(names) {
		t.Errorf("GetSKUs(%v + nowhere) found %d, want %d", names, len(got), len(names))
	}
	for _, name := range names {
		if s := got[name]; s == nil || s.Name != name || s.Shards != 2 {
			t.Errorf("GetSKUs: %s = %+v, want it with 2 shards", name, s)
		}
	}
}
