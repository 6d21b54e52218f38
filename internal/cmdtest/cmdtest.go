// Package cmdtest holds what the commands' in-process tests share.
package cmdtest

import (
	"strings"
	"sync"
	"testing"

	"github.com/shardstock/shardstock/internal/freeport"
)

// Output is an io.Writer that keeps what a command prints, safe for the
// command's goroutines and the test's at once.
type Output struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (o *Output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(b)
}

// String is everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Line returns the rest of the first line written that starts with
// prefix, and whether there is one.
func (o *Output) Line(prefix string) (string, bool) {
	for _, l := range strings.Split(o.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			return rest, true
		}
	}
	return "", false
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago,
// for a listener a command opens itself (freeport.Addr).
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}
