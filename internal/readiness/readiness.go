// Package readiness is how a shardstock process tells a program that it is
// ready: one JSON object on a line of its standard output, beside the lines
// it prints for people, e.g.
//
//	{"ready":true,"role":"allocator","addr":"http://127.0.0.1:8080","operator":"http://127.0.0.1:9090"}
//
// A program starting a process reads its output line by line and takes
// the first line Parse accepts for the role it waits for; it never matches
// the human lines, which may change.
package readiness

import (
	"context"
	"encoding/json"
	"io"
	"time"
)

// The roles of the processes that announce themselves.
const (
	RoleShard     = "shard"     // a shard server (cmd/shard)
	RoleAllocator = "allocator" // an allocator (cmd/allocator)
	RoleDev       = "dev"       // the dev stack (cmd/shardstock-dev, make run)
)

// pollInterval is how often Announce asks whether the process is ready:
// the check reads in-memory state only, and a reader waits at most this
// much longer than the process's /readyz would make it.
const pollInterval = 50 * time.Millisecond

// Line is a process's readiness line.
type Line struct {
	// Ready is always true: it tells the line from other JSON a process
	// may print (a log line in JSON).
	Ready bool   `json:"ready"`
	Role  string `json:"role"`
	// ID is a shard server's id.
	ID string `json:"id,omitempty"`
	// Addr is the URL of the process's main listener: the public API (an
	// allocator, the dev stack) or the ShardService (a shard server, which
	// serves /metrics and /debug/pprof/ there too).
	Addr string `json:"addr"`
	// Operator is the URL of an allocator's operator listener (/metrics,
	// /debug/pprof/, /healthz, /readyz).
	Operator string `json:"operator,omitempty"`
	// Shards are the dev stack's shard servers that run as processes of
	// their own (not -allocator-shard's, which runs inside the allocator).
	Shards []Shard `json:"shards,omitempty"`
}

// Shard is one shard server of the dev stack.
type Shard struct {
	ID   string `json:"id"`
	Addr string `json:"addr"` // URL, as Line.Addr
}

// Announce writes l, marked ready, to w as one line once ready reports
// true (nil: at once), asking every pollInterval, and returns then or when
// ctx ends (writing nothing). A process runs it in a goroutine of its own
// once it listens: it announces itself once, when its /readyz first
// answers 200.
func Announce(ctx context.Context, w io.Writer, l Line, ready func() bool) error {
	if ready != nil {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		for !ready() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.Ready = true
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	// One write, so that the line never interleaves with another.
	_, err = w.Write(append(b, '\n'))
	return err
}

// Parse returns the readiness line that text is, and whether it is one: a
// JSON object with "ready": true and a role. Text with anything before the
// object (the dev stack's "[shard-1] " prefix of a child's line) is not.
func Parse(text string) (Line, bool) {
	var l Line
	if len(text) == 0 || text[0] != '{' || json.Unmarshal([]byte(text), &l) != nil {
		return Line{}, false
	}
	return l, l.Ready && l.Role != ""
}
