package ledger

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/shardstock/shardstock/internal/stock"
)

// A reconciliation reads each shard from its latest checkpoint on: what
// precedes it is taken on the checkpoint's word. The walk checks that
// word: scheduled passes also check, once each, every stretch of a
// shard's ledger from one checkpoint to the next (or from its opening
// balance to its first), oldest first, and record per shard how far they
// got (the Store's Walked), so that every stretch is checked once however
// long the ledger, walkStretchesPerPassMax at a time.

// walkStretchesPerPassMax bounds the stretches one pass walks, over every
// SKU: each is one range read of a shard's entries (CheckpointEntries of
// them, or fewer than twice that and a batch's after a new writer's
// first checkpoint), so a pass's walk reads at most about a thousand
// times that many entries, a bounded share of Postgres per interval
// however long the ledgers. A ledger that grows faster than that for long
// is walked later, as it quiets: its stretches are checked once each, in
// order, and none is skipped.
const walkStretchesPerPassMax = 1000

// Stretch is the entries of one shard between two of its checkpoints:
// those after From (or, From nil, from the shard's opening balance) up to
// To's entry.
type Stretch struct {
	Index   int32
	Opening stock.Counts
	From    *Checkpoint
	To      Checkpoint
	// Kinds sums the stretch's entries by kind.
	Kinds map[stock.OpKind]KindSum
	// BrokenChain counts its entries that do not start where the previous
	// one ended (the first where From, or the opening, left the shard).
	BrokenChain int64
}

// Unsound is a stretch that a walk found wrong, as recorded: To is the
// entry its end checkpoint covers, Detail what was wrong.
type Unsound struct {
	To     int64
	Detail string
}

// Walk is how far a walk got on one shard: every stretch up to the one
// ending at To is sound; Unsound, when not nil, is the stretch after it,
// found wrong (the walk does not go past it).
type Walk struct {
	Shard   int32
	To      int64
	Unsound *Unsound
}

// CheckStretch checks a stretch: its entries chain from its start
// checkpoint to its end checkpoint, every entry moves the counts its kind
// says, and the end checkpoint's received is the start's plus what the
// entries brought in.
func CheckStretch(st Stretch) []Discrepancy {
	ds, add := discrepancies()
	start, received := startOf(st.Opening, st.From)
	end := fmt.Sprintf("checkpoint at entry %d", st.To.EntryID)
	inflow := checkEntries(add, st.Index, start, st.Kinds, st.BrokenChain, st.To.Counts, end)
	if received+inflow != st.To.Received {
		add(CheckWalk, st.Index, received+inflow, st.To.Received, "received: start %d + replenished and adjusted %d, %s says %d",
			received, inflow, end, st.To.Received)
	}
	return *ds
}

// walk checks up to limit of sku's stretches not walked yet and records
// how far it got on each shard. It returns how many it read and what was
// wrong: a shard's walk stops at its first wrong stretch, which is
// recorded (Snapshot reports it from then on).
func (s *Scheduler) walk(ctx context.Context, sku string, limit int) (int, []Discrepancy, error) {
	sts, err := s.cfg.Store.Stretches(ctx, sku, limit)
	if err != nil {
		return 0, nil, err
	}
	var ds []Discrepancy
	walks := map[int32]*Walk{}
	for _, st := range sts { // each shard's in order
		w := walks[st.Index]
		if w == nil {
			w = &Walk{Shard: st.Index}
			walks[st.Index] = w
		}
		if w.Unsound != nil {
			continue
		}
		if found := CheckStretch(st); len(found) > 0 {
			w.Unsound = &Unsound{To: st.To.EntryID, Detail: summary(found)}
			ds = append(ds, found...)
			continue
		}
		w.To = st.To.EntryID
	}
	for _, idx := range slices.Sorted(maps.Keys(walks)) {
		if err := s.cfg.Store.Walked(ctx, sku, *walks[idx]); err != nil {
			return len(sts), ds, fmt.Errorf("ledger: record the walk of %s shard %d: %w", sku, idx, err)
		}
	}
	return len(sts), ds, nil
}

// summary says what ds found, in one line.
func summary(ds []Discrepancy) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Check + ": " + d.Detail
	}
	return strings.Join(parts, "; ")
}
