// Package batch is smart batching's one step, shared by the shard writers,
// their group committer and the allocator's shard-server clients: after
// blocking for the first item, take whatever else is already queued, without
// waiting, up to a cap. At low load a batch is one item; under load it is
// whatever arrived while the last batch was being served. No timer.
package batch

// Fill returns first and the items queued on ch, at most max in all; it
// never waits.
func Fill[T any](first T, ch <-chan T, max int) []T {
	items := []T{first}
	for len(items) < max {
		select {
		case it := <-ch:
			items = append(items, it)
		default:
			return items
		}
	}
	return items
}
