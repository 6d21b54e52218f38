package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen/drop"
	"github.com/shardstock/shardstock/bench/internal/loadgen/shardstock"
	"github.com/shardstock/shardstock/internal/proccpu"
)

// dropFlags are model drop's own flags; -requests, -rate, -duration and
// -shards (its first count) give its arrivals, their rate, its time bound
// and its SKUs' shards.
type dropFlags struct {
	units, waitlist int64
	perCustomer     int64
	after, inFlight int
	afterRounds     int
	warmup          int
	think           time.Duration
	release         float64
	noCeiling, swap bool
}

func (d *dropFlags) register(fs *flag.FlagSet) {
	fs.Int64Var(&d.units, "drop-units", drop.UnitsDefault, "model drop: units of the SKU under admission (and of the plain SKU of its reserve phase)")
	fs.Int64Var(&d.waitlist, "drop-waitlist", drop.WaitlistDefault, "model drop: the SKU's waitlistMax")
	fs.Int64Var(&d.perCustomer, "drop-tokens-per-customer", 0, "model drop: the SKU's tokensPerCustomer (each request is a customer of its own); 0: none, so tokens are granted directly while units are free")
	fs.IntVar(&d.after, "drop-after", drop.AfterDefault, "model drop: RequestTokens sent once the SKU is sold out for good (and the ceiling's deducts of a sold-out SKU), at -rate; 0: none")
	fs.IntVar(&d.afterRounds, "drop-after-rounds", 1, "model drop: send the requests after the sell-out and the ceiling's in this many slices each, taking turns, the order reversed every other round, so that the machine's drift falls on both alike")
	fs.IntVar(&d.inFlight, "drop-in-flight", drop.InFlightMaxDefault, "model drop: requests in flight at most; an arrival beyond it waits (counted as sent late)")
	fs.DurationVar(&d.think, "drop-think", drop.ThinkDefault, "model drop: time from a token or reservation to its Commit or Release")
	fs.Float64Var(&d.release, "drop-release", drop.ReleaseDefault, "model drop: share of the tokens and reservations released rather than bought")
	fs.BoolVar(&d.swap, "drop-swap", false, "model drop: run the drop before its reserve phase, and the ceiling before the refusals after the sell-out (alternate it over rounds)")
	fs.BoolVar(&d.noCeiling, "drop-no-ceiling", false, "model drop: do not measure the in-memory ceiling")
	fs.IntVar(&d.warmup, "drop-warmup", 0, "model drop: Reserves and RequestTokens sent, unmeasured, to SKUs of their own before the measured phases, so that neither pays for a fresh stack's first connections; 0: none")
}

// checkDrop refuses what model drop cannot run with.
func (c *config) checkDrop() error {
	if c.stackBin == "" {
		return errors.New("model drop needs -stack: it reads the stack's CPU")
	}
	if !slices.Equal(targetNames(c.targetList), []string{"shardstock"}) {
		return errors.New("model drop runs on -target shardstock alone")
	}
	// The model reads zero as "default": refuse it here.
	if c.drop.units < 1 || c.drop.inFlight < 1 || c.drop.afterRounds < 1 {
		return fmt.Errorf("-drop-units %d, -drop-in-flight %d, -drop-after-rounds %d: want at least 1 units, 1 in flight and 1 round", c.drop.units, c.drop.inFlight, c.drop.afterRounds)
	}
	cfg := c.dropConfig("check")
	_, err := drop.Check(cfg)
	return err
}

// targetNames are -target's names, nil if it does not parse.
func targetNames(s string) []string {
	names, err := parseTargets(s)
	if err != nil {
		return nil
	}
	return names
}

// dropConfig is model drop's configuration from the flags.
func (c *config) dropConfig(runID string) drop.Config {
	shards, _ := parseShards(c.shardList)
	cfg := drop.Config{RunID: runID, Units: c.drop.units, Arrivals: int(c.requests), Rate: c.rate, Duration: c.duration,
		Think: c.drop.think, Release: c.drop.release, WaitlistMax: c.drop.waitlist, TokensPerCustomer: c.drop.perCustomer, After: c.drop.after, AfterRounds: c.drop.afterRounds, InFlightMax: c.drop.inFlight, Swap: c.drop.swap,
		Warmup: c.drop.warmup}
	if len(shards) > 0 {
		cfg.Shards = shards[0]
	}
	return cfg
}

// runDrop runs model drop on the stack and prints its report.
func (c *config) runDrop(ctx context.Context, opts options, st *stack, stdout, stderr io.Writer) error {
	var b [4]byte
	_, _ = rand.Read(b[:])
	env, closeEnv, err := dropEnv(ctx, opts, st, !c.drop.noCeiling, stderr)
	defer closeEnv()
	if err != nil {
		return err
	}
	rep, err := drop.Run(ctx, c.dropConfig(hex.EncodeToString(b[:])), env)
	if rep != nil {
		fmt.Fprintf(stdout, "stack: %s%s\n", st.dbNote, argsNote(c.stackArgs))
		rep.Write(stdout)
		fmt.Fprintln(stdout)
	}
	return err
}

// dropEnv is what model drop runs against: the stack's clients and CPU,
// and with ceiling the in-memory ceiling (started by the drop). The
// returned func closes what it opened; it is never nil.
func dropEnv(ctx context.Context, opts options, st *stack, ceiling bool, stderr io.Writer) (drop.Env, func(), error) {
	mr := &modelRun{opts: opts, stack: st, stderr: stderr}
	parts, _, err := mr.serverRoots(ctx, "shardstock", nil)
	if err != nil {
		return drop.Env{}, func() {}, fmt.Errorf("drop: %w", err)
	}
	target := shardstock.New(shardstock.Config{Addr: opts.addr, AdminToken: opts.adminToken, ServiceToken: opts.serviceToken})
	inv, admin := target.Clients()
	env := drop.Env{Inv: inv, Admin: admin, ServerCPU: partsCPU(parts), Log: stderr}
	closers := []func() error{target.Close}
	if ceiling {
		m := newMemoryTarget(opts)
		closers = append(closers, m.Close)
		env.Ceiling = m
		env.CeilingCPU = func() (time.Duration, error) {
			pid, err := serverPid(m)
			if err != nil {
				return 0, err
			}
			return proccpu.Tree(pid)
		}
	}
	return env, func() {
		for _, f := range slices.Backward(closers) {
			if err := f(); err != nil {
				fmt.Fprintf(stderr, "loadgen: drop: close: %v\n", err)
			}
		}
	}, nil
}

// partsCPU reads the CPU time of every part's processes and their children.
func partsCPU(parts []serverPart) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		var sum time.Duration
		for _, p := range parts {
			t, err := proccpu.Tree(p.pids...)
			if err != nil {
				return 0, err
			}
			sum += t
		}
		return sum, nil
	}
}
