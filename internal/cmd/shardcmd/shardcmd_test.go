package shardcmd_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/cmd/shardcmd"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRun_Durability: a shard server refuses a database that acknowledges
// commits before their WAL is flushed, and one without a synchronous
// standby when told to require one, before it takes any partition.
func TestRun_Durability(t *testing.T) {
	url := pgtest.NewMigratedDB(t)
	e := etcdtest.Start(t)
	for _, tc := range []struct {
		name string
		url  string
		args []string
		want string
	}{
		{"AsyncCommit", url + "&synchronous_commit=off", nil, "synchronous_commit=off"},
		{"NoSyncStandby", url, []string{"-require-sync-standby"}, "synchronous replication is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := append([]string{"-addr", "127.0.0.1:0", "-id", "d1", "-database-url", tc.url,
				"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-log-level", "error"}, tc.args...)
			err := shardcmd.Run(ctx, args, func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run(%v) = %v, want an error naming %q", tc.args, err, tc.want)
			}
			if ctx.Err() != nil {
				t.Errorf("Run(%v) returned only when its context ended", tc.args)
			}
		})
	}
}

// TestRun_GroupDelayBounds: a -group-delay outside 0 to 10ms is refused,
// by flag or by environment, before anything starts.
func TestRun_GroupDelayBounds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-group-delay", "1s"}, nil},
		{[]string{"-group-delay", "-1ms"}, nil},
		{nil, map[string]string{"SHARDSTOCK_GROUP_DELAY": "11ms"}},
	} {
		args := append([]string{"-addr", "127.0.0.1:0", "-id", "g1", "-database-url", "postgres://nowhere.invalid/x"}, tc.args...)
		err := shardcmd.Run(context.Background(), args, func(k string) string { return tc.env[k] }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-group-delay") || !strings.Contains(err.Error(), "want 0 to 10ms") {
			t.Errorf("Run(%v, env %v) = %v, want the -group-delay bound named", tc.args, tc.env, err)
		}
	}
}
