package topology

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Epochs and fencing tokens are etcd revisions, and the databases keep the
// highest they saw. An etcd restored from a snapshot without
// --bump-revision, or rebuilt empty, starts again below them: every
// takeover and move it allows would be refused by the databases. Revision
// lets a process see that; BumpRevision is one way back.
const (
	// revisionBumpKey is the key BumpRevision writes: nothing reads it.
	revisionBumpKey = "/shardstock/revision-bump"
	// RevisionBumpMax bounds the writes of one BumpRevision (each write
	// raises the revision by one; a larger gap is etcdutl snapshot
	// restore --bump-revision's job, which costs no writes).
	RevisionBumpMax = 1_000_000
)

// Revision is etcd's current revision.
func Revision(ctx context.Context, client *clientv3.Client) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := client.Get(rctx, revisionBumpKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("etcd revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// BumpRevision writes revisionBumpKey until etcd's revision is at least
// past, and returns the revision reached. It refuses a gap over
// RevisionBumpMax. It is safe while shardstock runs: every epoch or token
// etcd hands out afterwards is above every one the databases recorded,
// which is what they require.
func BumpRevision(ctx context.Context, client *clientv3.Client, past int64) (int64, error) {
	rev, err := Revision(ctx, client)
	if err != nil {
		return 0, err
	}
	if gap := past - rev; gap > RevisionBumpMax {
		return rev, fmt.Errorf("etcd revision %d is %d below %d: more than %d writes; restore a snapshot with etcdutl --bump-revision instead",
			rev, gap, past, RevisionBumpMax)
	}
	for i := 0; rev < past && i < RevisionBumpMax; i++ {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		resp, err := client.Put(rctx, revisionBumpKey, "")
		cancel()
		if err != nil {
			return rev, fmt.Errorf("bump etcd revision: %w", err)
		}
		rev = resp.Header.Revision
	}
	return rev, nil
}
