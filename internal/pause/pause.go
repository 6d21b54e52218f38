// Package pause waits for a time or for a context to end, whichever comes
// first: the one wait of every retry and poll loop that must stop with its
// context (a request's deadline, a process's shutdown), not a pause later.
package pause

import (
	"context"
	"time"
)

// For waits d, or less if ctx ends first; it reports whether all of d
// passed.
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
