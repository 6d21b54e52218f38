package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
)

// Bounds of -interleave.
const (
	interleaveMax       = 60                     // rounds
	interleaveWindowMin = 500 * time.Millisecond // -duration / rounds
)

// redisTargets share one Redis server; redis-fsync and the Redis API turn
// its append-only file on for their run, so redis, which runs with it as
// it is, cannot take turns with them.
var redisTargets = []string{"redis", "redis-fsync", redisAPIName, redisAPIBareName}

// checkInterleave refuses what cannot take turns: the models and flags
// that measure one run's wall-clock time (the disk probe, crashes,
// profiles, the paced reruns) and targets that change each other's
// server.
func (c *config) checkInterleave(p *plan) error {
	if c.interleave == 0 || c.interleave == 1 {
		return nil
	}
	if c.interleave < 0 || c.interleave > interleaveMax {
		return fmt.Errorf("-interleave %d: want 2 to %d rounds, or 0 (off)", c.interleave, interleaveMax)
	}
	if c.duration/time.Duration(c.interleave) < interleaveWindowMin {
		return fmt.Errorf("-interleave %d: windows of -duration %s / %d are shorter than %s", c.interleave, c.duration, c.interleave, interleaveWindowMin)
	}
	if c.paced != 0 || c.diskProbe != "" || c.pgCrashCount != 0 || c.serverProf != "" {
		return errors.New("-interleave runs without -paced, -disk-probe, -pg-crash-count and -server-profile: they measure one target's load as one stretch of time")
	}
	// A run bounded by count would be done in its first windows, the
	// rest loading nothing: no turns at all.
	if c.requests != 0 || slices.Contains(p.models, loadgen.ModelCase) {
		return errors.New("-interleave: the turns take time: not with -requests, nor model case (500 requests)")
	}
	if slices.Contains(p.models, loadgen.ModelDrop) {
		return errors.New("-interleave: model drop runs its own phases, not targets in turn")
	}
	if slices.Contains(p.names, "redis") && slices.ContainsFunc(p.names, func(n string) bool { return n != "redis" && slices.Contains(redisTargets, n) }) {
		return errors.New("-interleave: redis cannot take turns with another Redis target: they share the server, and the others turn fsync on")
	}
	return nil
}

// turn is one target's run of an interleaved model.
type turn struct {
	label   string
	t       loadgen.Target
	session *loadgen.Session
	cpu     *loadgen.CPU // summed over the windows
}

// runInterleaved runs the model's targets in turns: each is set up, then
// in every round each loads for -duration / rounds, the order reversed
// every other round (A B, B A, A B, ...), so that what else the shared
// machine does over the run falls on every target alike; each is
// verified after the last round, and the targets are closed in the
// reverse order of their setups (each puts back what its setup changed).
// A target's server CPU is summed over its windows.
func (mr *modelRun) runInterleaved(ctx context.Context, rounds int) ([]*loadgen.Result, []error) {
	var errs []error
	var turns []*turn
	defer func() {
		for _, tu := range slices.Backward(turns) {
			if err := tu.t.Close(); err != nil {
				fmt.Fprintf(mr.stderr, "loadgen: %s: close: %v\n", tu.label, err)
			}
		}
	}()
	for _, name := range mr.names {
		for _, n := range mr.shards {
			cfg := mr.cfg
			cfg.Shards = n
			cfg.Progress = nil
			label := name
			if len(mr.shards) > 1 {
				label = fmt.Sprintf("%s/%d", name, n)
			}
			tu := &turn{label: label}
			cfg.LoadStarted, cfg.LoadEnded = mr.windowCPU(ctx, name, func() loadgen.Target { return tu.t }, &tu.cpu)
			runner, err := loadgen.NewRunner(cfg)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			tu.t = targets[name](mr.opts)
			turns = append(turns, tu)
			if tu.session, err = runner.Start(ctx, tu.t); err != nil {
				fmt.Fprintf(mr.stderr, "loadgen: %s: %v\n", label, err)
				errs = append(errs, err)
			}
		}
	}
	live := slices.DeleteFunc(slices.Clone(turns), func(tu *turn) bool { return tu.session == nil })
	fmt.Fprintf(mr.stderr, "loadgen: model %s, %d clients, %d targets in %d rounds of %s each\n",
		mr.cfg.Model, mr.cfg.Concurrency, len(live), rounds, mr.cfg.Duration/time.Duration(rounds))
	window := mr.cfg.Duration / time.Duration(rounds)
	// A stack that died ends the rounds; every target is still verified,
	// so that the others' results are kept.
rounds:
	for r := range rounds {
		order := live
		if r%2 == 1 {
			order = slices.Clone(live)
			slices.Reverse(order)
		}
		for _, tu := range order {
			if ctx.Err() != nil {
				break rounds
			}
			if mr.stack != nil {
				if err := mr.stack.alive(); err != nil {
					errs = append(errs, fmt.Errorf("model %s: rounds ended after %d of %d: %w", mr.cfg.Model, r, rounds, err))
					break rounds
				}
			}
			tu.session.Load(ctx, window)
		}
	}
	var results []*loadgen.Result
	for _, tu := range live {
		res, err := tu.session.Finish(ctx)
		if err != nil {
			fmt.Fprintf(mr.stderr, "loadgen: %s: %v\n", tu.label, err)
			errs = append(errs, err)
			continue
		}
		res.Target, res.CPU = tu.label, tu.cpu
		fmt.Fprintf(mr.stderr, "loadgen: %s: setup %s, load %s in %d windows, verify %s\n", tu.label,
			res.SetupTime.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond), rounds, res.VerifyTime.Round(time.Millisecond))
		results = append(results, res)
	}
	return results, errs
}

// windowCPU gives a run loaded in windows hooks that measure each window
// as cpuHooks measures a whole load, and sum the windows into *out.
func (mr *modelRun) windowCPU(ctx context.Context, name string, target func() loadgen.Target, out **loadgen.CPU) (func(), func()) {
	var w *loadgen.CPU
	var ended func()
	return func() {
			var started func()
			started, ended = mr.cpuHooks(ctx, name, target, nil, nil, &w)
			started()
		}, func() {
			ended()
			*out = addCPU(*out, w)
		}
}

// addCPU returns sum with w added: times summed, parts by position (every
// window of a target has the same parts), the first error kept. The
// client's time is summed whatever the server's: the table prints it
// also when the server was not measured.
func addCPU(sum, w *loadgen.CPU) *loadgen.CPU {
	if sum == nil {
		c := *w
		c.Parts = slices.Clone(w.Parts)
		return &c
	}
	sum.Client += w.Client
	if sum.Err != nil {
		return sum
	}
	if w.Err != nil || len(w.Parts) != len(sum.Parts) {
		sum.Err = w.Err
		if sum.Err == nil {
			sum.Err = fmt.Errorf("the server side's parts changed between windows (%d, then %d)", len(sum.Parts), len(w.Parts))
		}
		return sum
	}
	sum.Server += w.Server
	for i := range sum.Parts {
		sum.Parts[i].Time += w.Parts[i].Time
	}
	return sum
}
