package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/bench/internal/loadgen/pgcrash"
)

// crashPlan is -pg-crash-count's: crash-restart the private Postgres during
// every shardstock load.
type crashPlan struct {
	dataDir, url string
	every        time.Duration
	count        int
}

// crashMargin is the load time left after the last planned crash, so that
// it lands within the load and the clients see the database come back.
const crashMargin = 5 * time.Second

// newCrashPlan checks the crash flags against the run's: the load must be
// long enough for every crash, and there must be a shardstock load to crash.
func newCrashPlan(dataDir, url string, every time.Duration, count int, duration time.Duration, models []loadgen.Model, names []string) (*crashPlan, error) {
	switch {
	case count < 0 || count > pgcrash.CountMax:
		return nil, fmt.Errorf("-pg-crash-count %d: want 0 to %d", count, pgcrash.CountMax)
	case every < pgcrash.EveryMin:
		return nil, fmt.Errorf("-pg-crash-every %s: want at least %s", every, pgcrash.EveryMin)
	case dataDir == "" || url == "":
		return nil, fmt.Errorf("-pg-crash-count needs -pg-data and -database-url: the private cluster to crash")
	case !slices.Contains(names, "shardstock"):
		return nil, fmt.Errorf("-pg-crash-count crashes Postgres during shardstock's loads: add shardstock to -target")
	case slices.Contains(models, loadgen.ModelCase):
		return nil, fmt.Errorf("-pg-crash-count: the case model is over before a crash: use models A, B or C")
	}
	if need := time.Duration(count)*every + crashMargin; duration < need {
		return nil, fmt.Errorf("-duration %s: %d crashes every %s need a load of at least %s", duration, count, every, need)
	}
	return &crashPlan{dataDir: dataDir, url: url, every: every, count: count}, nil
}

// hooks wraps a run's load hooks: the crash loop starts with the load and
// stops (waiting for Postgres to answer) before Verify; *out receives what
// it did.
func (p *crashPlan) hooks(ctx context.Context, started, ended func(), out **loadgen.Crashes, log io.Writer) (func(), func()) {
	var l *pgcrash.Loop
	res := &loadgen.Crashes{What: "pg_ctl stop -m immediate, then start on the same port", Every: p.every, Planned: p.count}
	*out = res
	start := func() {
		if started != nil {
			started()
		}
		var err error
		if l, err = pgcrash.Start(ctx, pgcrash.Config{DataDir: p.dataDir, URL: p.url, Every: p.every, Count: p.count, Log: log}); err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
	}
	end := func() {
		if l != nil {
			r := l.Stop()
			for _, c := range r.Crashes {
				if c.Err != nil {
					res.Errors = append(res.Errors, c.Err.Error())
					continue
				}
				if res.Done == 0 || c.Down < res.DownMin {
					res.DownMin = c.Down
				}
				res.DownMax = max(res.DownMax, c.Down)
				res.Done++
			}
		}
		if ended != nil {
			ended()
		}
	}
	return start, end
}
