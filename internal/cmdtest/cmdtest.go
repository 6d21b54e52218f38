// Package cmdtest holds what the commands' in-process tests share.
package cmdtest

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/freeport"
	"github.com/shardstock/shardstock/internal/readiness"
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

// WaitReady waits up to within for the readiness line of role (package
// readiness) and returns it.
func (o *Output) WaitReady(tb testing.TB, role string, within time.Duration) readiness.Line {
	tb.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		for _, text := range strings.Split(o.String(), "\n") {
			if l, ok := readiness.Parse(text); ok && l.Role == role {
				return l
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no readiness line of role %s within %s: %q", role, within, o.String())
		}
	}
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
