package main

import (
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
)

// TestNewCrashPlan checks that a crash soak is refused when it could not
// make its crashes: too short a load, no shardstock load, the case model,
// no cluster named.
func TestNewCrashPlan(t *testing.T) {
	const dir, url = "/tmp/pg/data", "postgres://postgres@127.0.0.1:40000/postgres"
	b, ss := []loadgen.Model{loadgen.ModelB}, []string{"shardstock"}
	for _, tc := range []struct {
		name     string
		dir, url string
		every    time.Duration
		count    int
		duration time.Duration
		models   []loadgen.Model
		names    []string
		want     string // "" for no error
	}{
		{"OK", dir, url, 5 * time.Second, 8, 60 * time.Second, b, ss, ""},
		{"TooShort", dir, url, 5 * time.Second, 8, 40 * time.Second, b, ss, "need a load of at least 45s"},
		{"TooOften", dir, url, 100 * time.Millisecond, 8, time.Minute, b, ss, "want at least 1s"},
		{"TooMany", dir, url, time.Second, 101, time.Hour, b, ss, "want 0 to 100"},
		{"NoData", "", url, 5 * time.Second, 8, time.Minute, b, ss, "needs -pg-data"},
		{"NoShardstock", dir, url, 5 * time.Second, 8, time.Minute, b, []string{"onerow"}, "add shardstock"},
		{"Case", dir, url, 5 * time.Second, 8, time.Minute, []loadgen.Model{loadgen.ModelCase}, ss, "case model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newCrashPlan(tc.dir, tc.url, tc.every, tc.count, tc.duration, tc.models, tc.names)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("newCrashPlan() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("newCrashPlan() = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
