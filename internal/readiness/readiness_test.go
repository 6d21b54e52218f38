package readiness_test

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/readiness"
)

func TestAnnounce(t *testing.T) {
	t.Run("WaitsForReady", func(t *testing.T) {
		var out cmdtest.Output
		var ready atomic.Bool
		want := readiness.Line{Role: readiness.RoleDev, Addr: "http://127.0.0.1:1", Operator: "http://127.0.0.1:2",
			Shards: []readiness.Shard{{ID: "shard-1", Addr: "http://127.0.0.1:3"}}}
		done := make(chan error, 1)
		go func() { done <- readiness.Announce(context.Background(), &out, want, ready.Load) }()
		time.Sleep(200 * time.Millisecond) // four polls
		if got := out.String(); got != "" {
			t.Fatalf("Announce wrote %q before ready", got)
		}
		ready.Store(true)
		if err := <-done; err != nil {
			t.Fatalf("Announce() = %v", err)
		}
		text, ok := strings.CutSuffix(out.String(), "\n")
		if !ok || strings.Contains(text, "\n") {
			t.Fatalf("Announce wrote %q, want one line", out.String())
		}
		got, ok := readiness.Parse(text)
		want.Ready = true
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("Parse(%s) = %+v, %v, want %+v, true", text, got, ok, want)
		}
	})
	t.Run("Canceled", func(t *testing.T) {
		var out cmdtest.Output
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err := readiness.Announce(ctx, &out, readiness.Line{Role: readiness.RoleShard}, func() bool { return false })
		if err == nil || out.String() != "" {
			t.Errorf("Announce(never ready) = %v, wrote %q; want the context's error and nothing", err, out.String())
		}
	})
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		text string
		want bool
	}{
		{`{"ready":true,"role":"shard","id":"s1","addr":"http://127.0.0.1:7001"}`, true},
		{`[shard-1] {"ready":true,"role":"shard","id":"s1","addr":"http://127.0.0.1:7001"}`, false},
		{`{"ready":false,"role":"shard"}`, false},
		{`{"ready":true}`, false},
		{`{"level":"INFO","msg":"shard server started","ready":"yes"}`, false},
		{`allocator listening on http://127.0.0.1:8080`, false},
		{``, false},
	} {
		if _, ok := readiness.Parse(tc.text); ok != tc.want {
			t.Errorf("Parse(%s) ok = %v, want %v", tc.text, ok, tc.want)
		}
	}
}
