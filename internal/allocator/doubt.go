package allocator

import (
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the keys in doubt.
const (
	// doubtHold is how long GetOperation answers OPERATION_IN_PROGRESS for
	// a key that Allocate answered SHARD_UNAVAILABLE while a shard may
	// still apply it. A shard applies what it accepted when its writer
	// reaches it: one batch normally, at worst batchAttemptsMax attempts
	// of batchTimeout (10 s) each behind the requests queued before it
	// (internal/shard/writer.go). Two minutes is above that for any queue
	// that is moving; a shard stalled longer is not covered.
	doubtHold = 2 * time.Minute
	// doubtKeysMax bounds the keys held in doubt. A key that does not fit
	// must not be answered OPERATION_NOT_FOUND either, so an overflow makes
	// GetOperation answer OPERATION_IN_PROGRESS for every key it does not
	// find, until doubtHold after the last overflow.
	doubtKeysMax = 1 << 16
)

// doubtBook remembers the keys (sku + "\x00" + key) whose request was
// answered SHARD_UNAVAILABLE while a shard may still apply it, for
// GetOperation: a client told OPERATION_NOT_FOUND would buy again under a
// new key, and then the shard applies the first one too.
type doubtBook struct {
	n        atomic.Int64 // len(until): the common case, none, takes no lock
	mu       sync.Mutex
	until    map[string]time.Time
	overflow time.Time // every key is in doubt until then
}

// hold keeps key in doubt for doubtHold.
func (b *doubtBook) hold(key string) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil {
		b.until = map[string]time.Time{}
	}
	if _, ok := b.until[key]; !ok && len(b.until) >= doubtKeysMax {
		for k, t := range b.until {
			if now.After(t) {
				delete(b.until, k)
			}
		}
		if len(b.until) >= doubtKeysMax {
			b.overflow = now.Add(doubtHold)
			return
		}
	}
	b.until[key] = now.Add(doubtHold)
	b.n.Store(int64(len(b.until)))
}

// forget takes key out of doubt: a later request with it had an answer
// that no shard can change.
func (b *doubtBook) forget(key string) {
	if b.n.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.until, key)
	b.n.Store(int64(len(b.until)))
}

// holds reports whether key is in doubt now.
func (b *doubtBook) holds(key string) bool {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Before(b.overflow) {
		return true
	}
	t, ok := b.until[key]
	if ok && now.After(t) {
		delete(b.until, key)
		b.n.Store(int64(len(b.until)))
		return false
	}
	return ok
}
