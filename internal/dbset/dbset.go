// Package dbset is shardstock's storage when SKUs are placed on several
// Postgres databases: a Set holds one internal/postgres.DB per database,
// by name, and the placement (internal/topology.Placements), and answers
// each SKU's calls from the SKU's own database. It implements the
// allocator's Store, and gives a shard server its databases by name (Names,
// DB) and the database of each SKU (Locate) for shard.Config's DBs and
// Locate. A database that does not answer makes its own SKUs unavailable
// (retryable), never the others'.
package dbset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/shardstock/shardstock/internal/ledger"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/topology"
)

// locatedMax bounds the SKUs whose database the Set remembers after
// looking it up (only SKUs of slots that a newer placement version gave to
// another database need a lookup; the rest are computed).
const locatedMax = 100_000

// Placement is where the Set reads the placement from:
// *topology.Placements, or Fixed for a deployment of one database.
type Placement interface {
	Current() stock.Placement
	// Locked runs f under the placement lock with the placement and the
	// lock's fencing token (growing from holder to holder).
	Locked(ctx context.Context, f func(p stock.Placement, fence int64) error) error
	// Put publishes a placement; only inside Locked's f.
	Put(ctx context.Context, next stock.Placement) error
}

// Fixed is a placement that never changes, for one database without etcd.
type Fixed struct {
	P  stock.Placement
	mu sync.Mutex
}

// Current is f.P.
func (f *Fixed) Current() stock.Placement { return f.P }

// Locked runs fn under a process-local lock, with fence 1: one process,
// one holder at a time.
func (f *Fixed) Locked(_ context.Context, fn func(stock.Placement, int64) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fn(f.P, 1)
}

// Put refuses: a fixed placement does not change.
func (f *Fixed) Put(context.Context, stock.Placement) error {
	return stock.Errorf(stock.CodeUnimplemented, "the placement is fixed: run with etcd to change it")
}

var _ Placement = (*topology.Placements)(nil)

// Set is a set of named databases and the placement of SKUs on them.
type Set struct {
	dbs       map[string]*postgres.DB
	names     []string // sorted
	placement Placement
	located   *lru.Cache[string, string] // sku -> database, looked up
	// strays is set once a SKU was found in a database that no placement
	// version gives its slot (its version was lost before the databases
	// recorded placements): from then on located is read even for SKUs
	// whose placement names one database.
	strays atomic.Bool
	log    *slog.Logger
}

// New returns a Set over dbs (by name) placed by p.
func New(dbs map[string]*postgres.DB, p Placement) (*Set, error) {
	if len(dbs) == 0 {
		return nil, errors.New("dbset: no database")
	}
	located, err := lru.New[string, string](locatedMax)
	if err != nil {
		return nil, err
	}
	s := &Set{dbs: dbs, placement: p, located: located, log: slog.Default()}
	for name := range dbs {
		s.names = append(s.names, name)
	}
	sort.Strings(s.names)
	return s, nil
}

// SetLogger sets the logger of what the Set finds wrong with the
// placement (slog's default until then).
func (s *Set) SetLogger(l *slog.Logger) { s.log = l }

// Names are the databases this process can reach, sorted.
func (s *Set) Names() []string { return s.names }

// DB is the database called name, or nil.
func (s *Set) DB(name string) *postgres.DB { return s.dbs[name] }

// Readers are the databases' ledgers in commit order, by name, for
// ledger.Stream.
func (s *Set) Readers() map[string]ledger.Reader {
	out := make(map[string]ledger.Reader, len(s.dbs))
	for name, db := range s.dbs {
		out[name] = db
	}
	return out
}

// Placement is the current placement.
func (s *Set) Placement() stock.Placement { return s.placement.Current() }

// Configured reports whether the Set has database name.
func (s *Set) Configured(name string) bool { return s.dbs[name] != nil }

// SetPlacement publishes a version that spreads new SKUs over databases,
// each of which this process must have (the others need it too: an
// operator adds a database to every process's -databases first). Under the
// placement lock it shows the lock's fence to every database, records the
// new version in every one, and only then publishes it in etcd: a version
// etcd has is one the databases can give back if etcd loses it.
func (s *Set) SetPlacement(ctx context.Context, databases []string) (stock.Placement, error) {
	if err := stock.ValidateDatabases(databases); err != nil {
		return stock.Placement{}, err
	}
	for _, name := range databases {
		if s.dbs[name] == nil {
			return stock.Placement{}, stock.Errorf(stock.CodeInvalidArgument, "database %q is not configured on this allocator (-databases)", name)
		}
	}
	var out stock.Placement
	err := s.placement.Locked(ctx, func(p stock.Placement, fence int64) error {
		recorded, _, err := s.claim(ctx, fence, "")
		if err != nil {
			return err
		}
		if p, err = s.newest(ctx, p, recorded); err != nil {
			return err
		}
		next, err := p.Next(databases)
		if err != nil {
			return err
		}
		if err := s.each(ctx, func(ctx context.Context, _ string, db *postgres.DB) error {
			return db.RecordPlacement(ctx, next, fence)
		}); err != nil {
			return fenceError(err)
		}
		if err := s.placement.Put(ctx, next); err != nil {
			return stock.Errorf(stock.CodeShardUnavailable, "%v", err)
		}
		out = next
		return nil
	})
	return out, err
}

// claim shows fence, the placement lock's token, to every database at
// once and returns the newest placement they recorded and the one that
// holds a SKU named sku ("": none, or not asked).
func (s *Set) claim(ctx context.Context, fence int64, sku string) (stock.Placement, string, error) {
	var mu sync.Mutex
	var recorded stock.Placement
	holder := ""
	err := s.each(ctx, func(ctx context.Context, name string, db *postgres.DB) error {
		p, has, err := db.ClaimPlacement(ctx, fence, sku)
		mu.Lock()
		defer mu.Unlock()
		if p.Version() > recorded.Version() {
			recorded = p
		}
		if has && sku != "" {
			holder = name
		}
		return err
	})
	if err != nil {
		return recorded, holder, fenceError(err)
	}
	return recorded, holder, nil
}

// fenceError is err for a client: retryable whether a database did not
// answer or a newer holder of the placement lock fenced this one.
func fenceError(err error) error {
	if errors.Is(err, postgres.ErrPlacementFenced) {
		return stock.Errorf(stock.CodeShardUnavailable, "the placement lock was lost to a newer holder (retry; if it persists, etcd is behind the databases: docs/operations.md, \"etcd restored or rebuilt\"): %v", err)
	}
	if stock.CodeOf(err) != stock.CodeInternal {
		return err
	}
	return stock.Errorf(stock.CodeShardUnavailable, "%v", err)
}

// newest is the newer of p, etcd's placement, and recorded, the newest the
// databases recorded; if the databases have the newer, it is put back
// into etcd (under the lock), which lost it.
func (s *Set) newest(ctx context.Context, p, recorded stock.Placement) (stock.Placement, error) {
	if recorded.Version() <= p.Version() {
		return p, nil
	}
	s.log.Warn("placement in etcd older than the databases recorded: restoring", "etcd_version", p.Version(), "recorded_version", recorded.Version())
	if err := s.placement.Put(ctx, recorded); err != nil {
		return p, stock.Errorf(stock.CodeShardUnavailable, "restoring the placement: %v", err)
	}
	return recorded, nil
}

// Recorded is the newest placement any of dbs recorded (no version if
// none has): what LoadPlacements restores if etcd lost it.
func Recorded(ctx context.Context, dbs map[string]*postgres.DB) (stock.Placement, error) {
	var out stock.Placement
	for name, db := range dbs {
		p, _, err := db.RecordedPlacement(ctx)
		if err != nil {
			return out, fmt.Errorf("database %q: %w", name, err)
		}
		if p.Version() > out.Version() {
			out = p
		}
	}
	return out, nil
}

// Record records the current placement in every database that has an
// older one (a database added since, or one that never recorded it), so
// that each can give it back if etcd loses it.
func (s *Set) Record(ctx context.Context) error {
	p := s.placement.Current()
	return s.each(ctx, func(ctx context.Context, _ string, db *postgres.DB) error {
		return db.RecordPlacement(ctx, p, 0)
	})
}

// unconfigured is the error for a database the placement names but this
// process has no URL for: a deployment error, retryable once fixed.
func unconfigured(name string) error {
	return stock.Errorf(stock.CodeShardUnavailable, "database %q is not configured on this server", name)
}

// Locate names the database that holds sku: the newest placement's choice
// when no version placed the SKU's slot elsewhere (no query), else the
// first of its candidates, newest first, that has the SKU. A SKU that no
// candidate has is looked for in every other database (a lookup that
// misses costs one read per database); one found nowhere is placed where
// a new one would be (its calls then answer SKU_NOT_FOUND there). A
// database that does not answer before the SKU is found makes the answer
// SHARD_UNAVAILABLE.
func (s *Set) Locate(ctx context.Context, sku string) (string, error) {
	name, _, err := s.locate(ctx, sku)
	return name, err
}

// locate is Locate, with the SKU when a lookup read it (nil when the
// placement alone named the database, or a cached lookup did).
func (s *Set) locate(ctx context.Context, sku string) (string, *stock.SKU, error) {
	cands := s.placement.Current().Candidates(sku)
	if len(cands) == 1 && !s.strays.Load() {
		return cands[0], nil, nil
	}
	if name, ok := s.located.Get(sku); ok {
		return name, nil, nil
	}
	if len(cands) == 1 {
		return cands[0], nil, nil
	}
	for _, name := range cands {
		db := s.dbs[name]
		if db == nil {
			return "", nil, unconfigured(name)
		}
		found, err := db.GetSKU(ctx, sku)
		if err == nil {
			s.located.Add(sku, name)
			return name, found, nil
		}
		if stock.CodeOf(err) != stock.CodeSKUNotFound {
			return "", nil, stock.Errorf(stock.CodeShardUnavailable, "database %q: %v", name, err)
		}
	}
	return s.search(ctx, sku, cands)
}

// search looks for sku in the databases other than tried (which did not
// have it); found, it is remembered there. Found nowhere, it is placed
// where a new one would be (tried[0]).
func (s *Set) search(ctx context.Context, sku string, tried []string) (string, *stock.SKU, error) {
	for _, name := range s.names {
		if slices.Contains(tried, name) {
			continue
		}
		found, err := s.dbs[name].GetSKU(ctx, sku)
		if err == nil {
			s.located.Add(sku, name)
			s.strays.Store(true)
			s.log.Error("SKU found in a database its placement does not name: a placement version was lost before the databases recorded it",
				"sku", sku, "database", name, "candidates", tried)
			return name, found, nil
		}
		if stock.CodeOf(err) != stock.CodeSKUNotFound {
			return "", nil, stock.Errorf(stock.CodeShardUnavailable, "database %q: %v", name, err)
		}
	}
	return tried[0], nil, nil
}

// of is the database that holds sku.
func (s *Set) of(ctx context.Context, sku string) (*postgres.DB, error) {
	name, err := s.Locate(ctx, sku)
	if err != nil {
		return nil, err
	}
	db := s.dbs[name]
	if db == nil {
		return nil, unconfigured(name)
	}
	return db, nil
}

// CreateSKU creates the SKU in the database the newest placement gives
// it, under the placement lock. It first shows the lock's fencing token to
// every database this process has and looks for the name in each (a SKU
// lives in one database whatever happened to etcd's placement: a version
// lost or rolled back must not let the name be created again elsewhere),
// then inserts under the same token, which a database refuses if a newer
// holder has shown it a higher one since.
func (s *Set) CreateSKU(ctx context.Context, sku stock.SKU, initial int64) error {
	return s.placement.Locked(ctx, func(p stock.Placement, fence int64) error {
		recorded, holder, err := s.claim(ctx, fence, sku.Name)
		if err != nil {
			return err
		}
		if holder != "" {
			return stock.Errorf(stock.CodeSKUExists, "sku %q exists", sku.Name)
		}
		if p, err = s.newest(ctx, p, recorded); err != nil {
			return err
		}
		if createHook != nil {
			createHook(s, sku.Name)
		}
		name := p.Newest(sku.Name)
		db := s.dbs[name]
		if db == nil {
			return unconfigured(name)
		}
		if err := db.CreateSKUFenced(ctx, sku, initial, fence); err != nil {
			return fenceError(err)
		}
		if len(p.Candidates(sku.Name)) > 1 {
			s.located.Add(sku.Name, name)
		}
		return nil
	})
}

// createHook, if set (by tests), runs inside CreateSKU between the claims
// and the insert.
var createHook func(s *Set, sku string)

// GetSKU reads the SKU from its database (once: a lookup that found it
// answers). A SKU that the database the placement names does not have is
// looked for in the others.
func (s *Set) GetSKU(ctx context.Context, sku string) (*stock.SKU, error) {
	name, found, err := s.locate(ctx, sku)
	if err != nil || found != nil {
		return found, err
	}
	db := s.dbs[name]
	if db == nil {
		return nil, unconfigured(name)
	}
	got, err := db.GetSKU(ctx, sku)
	if stock.CodeOf(err) != stock.CodeSKUNotFound || len(s.placement.Current().Candidates(sku)) > 1 {
		return got, err // locate looked everywhere already when there were several
	}
	if _, found, serr := s.search(ctx, sku, []string{name}); serr != nil || found != nil {
		return found, serr
	}
	return got, err
}

// GetSKUs reads the configurations of names from their databases, one
// statement each; a SKU whose database the placement (or an earlier
// lookup) does not name alone is left out, as is one not found: the
// caller reads those one by one (GetSKU), which looks for them.
func (s *Set) GetSKUs(ctx context.Context, names []string) (map[string]*stock.SKU, error) {
	byDB := map[string][]string{}
	p := s.placement.Current()
	for _, sku := range names {
		cands := p.Candidates(sku)
		switch name, ok := s.located.Peek(sku); {
		case len(cands) == 1 && !s.strays.Load():
			byDB[cands[0]] = append(byDB[cands[0]], sku)
		case ok:
			byDB[name] = append(byDB[name], sku)
		}
	}
	out := make(map[string]*stock.SKU, len(names))
	for name, skus := range byDB {
		db := s.dbs[name]
		if db == nil {
			continue
		}
		got, err := db.GetSKUs(ctx, skus)
		if err != nil {
			return out, err
		}
		maps.Copy(out, got)
	}
	return out, nil
}

// UpdateSKU updates the SKU in its database.
func (s *Set) UpdateSKU(ctx context.Context, sku string, u stock.SKUUpdate) (*stock.SKU, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.UpdateSKU(ctx, sku, u)
}

// Shards reads the SKU's shard rows.
func (s *Set) Shards(ctx context.Context, sku string) ([]stock.ShardRow, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.Shards(ctx, sku)
}

// ResumeShard resumes a halted shard.
func (s *Set) ResumeShard(ctx context.Context, k stock.ShardKey) (string, error) {
	db, err := s.of(ctx, k.SKU)
	if err != nil {
		return "", err
	}
	return db.ResumeShard(ctx, k)
}

// SoldOutCheck reads the SKU's shards, stock in transit and operations of keys.
func (s *Set) SoldOutCheck(ctx context.Context, sku string, keys []string) ([]stock.ShardRow, int64, map[string]*stock.Operation, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, 0, nil, err
	}
	return db.SoldOutCheck(ctx, sku, keys)
}

// GetOperation reads a keyed operation of the SKU.
func (s *Set) GetOperation(ctx context.Context, sku, key string) (*stock.Operation, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.GetOperation(ctx, sku, key)
}

// LookupOperations reads a SKU's operations of keys, by key.
func (s *Set) LookupOperations(ctx context.Context, sku string, keys []string) (map[string]*stock.Operation, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.LookupOperations(ctx, sku, keys)
}

// OperationKeys lists a SKU's operation keys in its database.
func (s *Set) OperationKeys(ctx context.Context, sku string, limit int, each func(key string)) (int, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return 0, err
	}
	return db.OperationKeys(ctx, sku, limit, each)
}

// CreateTransfer records a transfer in its SKU's database.
func (s *Set) CreateTransfer(ctx context.Context, t *stock.Transfer) error {
	db, err := s.of(ctx, t.SKU)
	if err != nil {
		return err
	}
	return db.CreateTransfer(ctx, t)
}

// StockRead reads what GetStock shows of the SKU in one snapshot of its
// database.
func (s *Set) StockRead(ctx context.Context, sku string, movingMax int) (*stock.StockRead, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.StockRead(ctx, sku, movingMax)
}

// RaiseMoveFence raises the SKU's move fence.
func (s *Set) RaiseMoveFence(ctx context.Context, sku string, token int64, holder string) error {
	db, err := s.of(ctx, sku)
	if err != nil {
		return err
	}
	return db.RaiseMoveFence(ctx, sku, token, holder)
}

// SetShards changes the SKU's shard count.
func (s *Set) SetShards(ctx context.Context, sku string, n int32) (*stock.SKU, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.SetShards(ctx, sku, n)
}

// FinishRetirement ends the SKU's retirement of shards if it can.
func (s *Set) FinishRetirement(ctx context.Context, sku string, grace time.Duration) (bool, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return false, err
	}
	return db.FinishRetirement(ctx, sku, grace)
}

// ListLedger pages through the SKU's ledger.
func (s *Set) ListLedger(ctx context.Context, sku string, after int64, limit int) ([]*stock.LedgerEntry, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.ListLedger(ctx, sku, after, limit)
}

// Snapshot reads the SKU's books for reconciliation.
func (s *Set) Snapshot(ctx context.Context, sku string) (ledger.Snapshot, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return ledger.Snapshot{}, err
	}
	return db.Snapshot(ctx, sku)
}

// Stretches reads up to limit of the SKU's stretches no walk has checked.
func (s *Set) Stretches(ctx context.Context, sku string, limit int) ([]ledger.Stretch, error) {
	db, err := s.of(ctx, sku)
	if err != nil {
		return nil, err
	}
	return db.Stretches(ctx, sku, limit)
}

// Walked records how far a walk got on one of the SKU's shards.
func (s *Set) Walked(ctx context.Context, sku string, w ledger.Walk) error {
	db, err := s.of(ctx, sku)
	if err != nil {
		return err
	}
	return db.Walked(ctx, sku, w)
}

// SKUs returns up to limit SKU names above after, in order, from every
// database. A database that does not answer fails the listing: a pass
// over every SKU must not skip its SKUs unseen.
func (s *Set) SKUs(ctx context.Context, after string, limit int) ([]string, error) {
	out, err := gather(ctx, s, func(ctx context.Context, _ string, db *postgres.DB) ([]string, error) {
		return db.SKUs(ctx, after, limit)
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out[:min(len(out), limit)], nil
}

// ListSKUs returns up to limit SKUs that f selects with names above after,
// in byte order of their names, from every database: each gives its first
// limit, and the merge keeps the first limit of all, so a page misses
// none and, since a SKU lives in one database, repeats none. A database
// that does not answer fails the page (SHARD_UNAVAILABLE): a page that
// skipped its SKUs would skip them for good.
func (s *Set) ListSKUs(ctx context.Context, f stock.SKUFilter, after string, limit int) ([]stock.SKUSummary, error) {
	out, err := gather(ctx, s, func(ctx context.Context, name string, db *postgres.DB) ([]stock.SKUSummary, error) {
		page, err := db.ListSKUs(ctx, f, after, limit)
		for i := range page {
			page[i].Database = name
		}
		return page, err
	})
	if err != nil {
		return nil, stock.Errorf(stock.CodeShardUnavailable, "%v", err)
	}
	slices.SortFunc(out, func(a, b stock.SKUSummary) int { return strings.Compare(a.SKU.Name, b.SKU.Name) })
	return out[:min(len(out), limit)], nil
}

// gather runs f on every database at once and returns what they all
// returned, unordered, with their errors joined (each, named by its
// database).
func gather[T any](ctx context.Context, s *Set, f func(ctx context.Context, name string, db *postgres.DB) ([]T, error)) ([]T, error) {
	var mu sync.Mutex
	var out []T
	err := s.each(ctx, func(ctx context.Context, name string, db *postgres.DB) error {
		got, err := f(ctx, name, db)
		mu.Lock()
		out = append(out, got...)
		mu.Unlock()
		return err
	})
	return out, err
}

// each runs f on every database at once and joins the errors, each named
// by its database.
func (s *Set) each(ctx context.Context, f func(ctx context.Context, name string, db *postgres.DB) error) error {
	errs := make([]error, len(s.names))
	var wg sync.WaitGroup
	for i, name := range s.names {
		wg.Go(func() {
			if err := f(ctx, name, s.dbs[name]); err != nil {
				errs[i] = fmt.Errorf("database %q: %w", name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// InTransitTotal sums the stock in transit of every database. With a
// database down it sums the others and reports the error too.
func (s *Set) InTransitTotal(ctx context.Context) (int64, error) {
	var mu sync.Mutex
	var total int64
	err := s.each(ctx, func(ctx context.Context, _ string, db *postgres.DB) error {
		n, err := db.InTransitTotal(ctx)
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	})
	return total, err
}

// RetiringSKUs lists SKUs retiring shards, from every database that
// answers (up to limit from each): the rebalancer's work list, which a
// database down must not stop for the others.
func (s *Set) RetiringSKUs(ctx context.Context, limit int) ([]string, error) {
	out, err := gather(ctx, s, func(ctx context.Context, _ string, db *postgres.DB) ([]string, error) {
		return db.RetiringSKUs(ctx, limit)
	})
	slices.Sort(out)
	if len(out) > 0 {
		err = nil
	}
	return out, err
}

// ListTransfers pages through transfers. With a SKU, from its database;
// else from every database, merged in creation order (the order each
// database pages in): the page token names the last transfer of the page,
// whose creation time places it among every database's. A database that
// does not answer fails the listing: a page that silently skipped one
// would skip its transfers for good.
func (s *Set) ListTransfers(ctx context.Context, f stock.TransferFilter, afterID string, limit int) ([]*stock.Transfer, error) {
	if f.SKU != "" {
		db, err := s.of(ctx, f.SKU)
		if err != nil {
			return nil, err
		}
		return db.ListTransfers(ctx, f, afterID, limit)
	}
	from, found, err := s.cursor(ctx, afterID)
	if err != nil || !found {
		return nil, err
	}
	var mu sync.Mutex
	var out []*stock.Transfer
	err = s.each(ctx, func(ctx context.Context, _ string, db *postgres.DB) error {
		ts, err := db.ListTransfersFrom(ctx, f, from, limit)
		mu.Lock()
		out = append(out, ts...)
		mu.Unlock()
		return err
	})
	if err != nil {
		return nil, stock.Errorf(stock.CodeShardUnavailable, "%v", err)
	}
	slices.SortFunc(out, func(a, b *stock.Transfer) int {
		ca, cb := stock.TransferCursor{CreatedAt: a.CreatedAt, ID: a.ID}, stock.TransferCursor{CreatedAt: b.CreatedAt, ID: b.ID}
		switch {
		case ca.Before(cb):
			return -1
		case cb.Before(ca):
			return 1
		}
		return 0
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// cursor finds the transfer afterID in whichever database has it ("" is
// the start; found is false if no database has it).
func (s *Set) cursor(ctx context.Context, afterID string) (from stock.TransferCursor, found bool, err error) {
	if afterID == "" {
		return from, true, nil
	}
	var mu sync.Mutex
	err = s.each(ctx, func(ctx context.Context, _ string, db *postgres.DB) error {
		t, err := db.GetTransfer(ctx, afterID)
		if stock.CodeOf(err) == stock.CodeInvalidArgument {
			return nil
		}
		if err != nil {
			return err
		}
		mu.Lock()
		from, found = stock.TransferCursor{CreatedAt: t.CreatedAt, ID: t.ID}, true
		mu.Unlock()
		return nil
	})
	if err != nil && !found {
		return from, false, stock.Errorf(stock.CodeShardUnavailable, "%v", err)
	}
	return from, found, nil
}
