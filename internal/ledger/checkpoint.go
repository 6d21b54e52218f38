package ledger

import "github.com/shardstock/shardstock/internal/stock"

// CheckpointEntries is N, the number of a shard's entries between two of
// its checkpoints: a reconciliation and a shard's check after a divergence
// read one checkpoint and the entries after it, however long the ledger:
// fewer than N and one batch's, or, after a new writer's first write
// (CheckpointIfDue, after which it counts from zero), fewer than 2N and
// one batch's. A thousand keeps that read to about a
// millisecond's worth of index entries (the check runs inside a writer's
// batch timeout) while checkpoints add one row per thousand entries, and
// the batch that writes one reads the entries since the last to carry the
// running sums forward.
const CheckpointEntries = 1000

// Checkpoint is a shard's running balance after one of its entries,
// written by the shard's writer in the statement that appends that entry.
type Checkpoint struct {
	// EntryID is the last entry the checkpoint covers.
	EntryID int64
	// Counts are the shard's counts after that entry.
	Counts stock.Counts
	// Received is the shard's opening available plus every replenish and
	// adjustment up to that entry: what conservation needs of the entries
	// before the checkpoint.
	Received int64
}

// CheckpointFor says whether a writer that has appended since entries
// after its shard's last checkpoint (negative: it does not know, being
// new) makes one after adding more.
func CheckpointFor(since, adding int) stock.Checkpointing {
	switch {
	case adding == 0:
		return stock.CheckpointNone
	case since < 0:
		return stock.CheckpointIfDue
	case since+adding >= CheckpointEntries:
		return stock.CheckpointAlways
	}
	return stock.CheckpointNone
}

// PageMax bounds a page of a SKU's ledger: a reader pages by entry id
// (the cursor is the last id it has), oldest first.
const PageMax = 1000
