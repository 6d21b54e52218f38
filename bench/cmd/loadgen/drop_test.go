package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen/drop"
	"github.com/shardstock/shardstock/internal/pgtest"
)

// TestDrop_Stack runs a tiny bounded drop against the dev stack (real
// processes, its own database) and the in-memory ceiling's process: 20
// units, 100 arrivals at 400 a second, a waitlist of 30, 10% released.
// Its counts must add up: exactly as many tokens as units in the answers,
// every other arrival waitlisted or refused, the released units admitted
// from the waitlist and bought, the SKU sold out with every other ticket
// answered SOLD_OUT, and after the sell-out every request refused
// OUT_OF_STOCK, by shardstock and by the ceiling, in three turns each. Then loadgen's own
// command runs it and prints its lines.
func TestDrop_Stack(t *testing.T) {
	bin := buildStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	st, err := startStack(ctx, stackConfig{Bin: bin, ServerURL: pgtest.NewDB(t), BaselineConns: 1,
		Args: []string{"-shard-servers", "0", "-allocator-shard"}, LogPath: filepath.Join(t.TempDir(), "stack.log"), Stderr: &stderr})
	if err != nil {
		t.Fatalf("startStack() = %v\n%s", err, &stderr)
	}
	defer func() {
		if err := st.stop(); err != nil {
			t.Errorf("stop() = %v", err)
		}
	}()
	opts := options{addr: st.baseURL, adminToken: st.token, serviceToken: st.serviceToken, databaseURL: st.databaseURL}
	env, closeEnv, err := dropEnv(ctx, opts, st, true, &stderr)
	defer closeEnv()
	if err != nil {
		t.Fatal(err)
	}
	const units, arrivals, waitlist, after = 20, 100, 30, 50
	cfg := drop.Config{RunID: "t" + randomHex(4), Units: units, Arrivals: arrivals, Rate: 400, Duration: 10 * time.Second,
		Think: 100 * time.Millisecond, Release: 0.1, WaitlistMax: waitlist, After: after, AfterRounds: 3, Shards: 4,
		Warmup: 40} // on SKUs of their own: the counts below are the measured SKU's alone
	rep, err := drop.Run(ctx, cfg, env)
	if err != nil {
		t.Fatalf("Run() = %v\n%s", err, &stderr)
	}
	var out bytes.Buffer
	rep.Write(&out)
	t.Logf("report:\n%s", &out)

	d := rep.Drop
	if d.Arrivals != arrivals || d.ErrorTotal() != 0 {
		t.Fatalf("drop: %d arrivals, errors %v, want %d and none", d.Arrivals, d.Errors, arrivals)
	}
	// A ticket may be answered while a unit is promised to a request in
	// flight, and admitted a pass later: tokens granted are the direct
	// ones and those admitted, less the released units admitted again.
	if granted := d.Held + rep.Admitted - d.Released; granted != units || d.Held == 0 {
		t.Errorf("drop: %d tokens in the answers + %d admitted - %d released = %d granted, want %d (the units)",
			d.Held, rep.Admitted, d.Released, granted, units)
	}
	if got := d.Tickets + d.RefusedTotal(); got != arrivals-d.Held {
		t.Errorf("drop: %d waitlisted + %d refused = %d, want the other %d arrivals", d.Tickets, d.RefusedTotal(), got, arrivals-d.Held)
	}
	if d.Tickets > waitlist+units || d.Refused["WAITLIST_FULL"] != d.RefusedTotal() || d.RefusedTotal() == 0 {
		t.Errorf("drop: %d tickets, refused %v, want at most %d tickets waiting and WAITLIST_FULL past them", d.Tickets, d.Refused, waitlist)
	}
	if d.Released == 0 || d.Bought+d.Released != d.Held {
		t.Errorf("drop: %d bought + %d released, want the %d tokens, some released", d.Bought, d.Released, d.Held)
	}
	if rep.AdmitBuys != rep.Admitted || rep.SoldOut != d.Tickets-rep.Admitted {
		t.Errorf("waitlist: %d admitted, %d of them bought, %d SOLD_OUT; want every admitted ticket bought, the other %d SOLD_OUT",
			rep.Admitted, rep.AdmitBuys, rep.SoldOut, d.Tickets-rep.Admitted)
	}
	if s := rep.Final; s.GetSold() != units || s.GetAvailable() != 0 || s.GetReserved() != 0 {
		t.Errorf("final stock %v, want %d sold and nothing left", s, units)
	}
	if r := rep.Reserve; r.Held < units || r.ErrorTotal() != 0 || r.Held+r.RefusedTotal() != arrivals || r.LastHold == 0 {
		t.Errorf("reserve phase: %d held, refused %v, errors %v, last hold at %s; want at least %d held, the rest OUT_OF_STOCK",
			r.Held, r.Refused, r.Errors, r.LastHold, units)
	}
	if d.LastHold == 0 || d.CPU <= 0 || rep.Reserve.CPU <= 0 {
		t.Errorf("drop: last unit in a token at %s, CPU %s, the reserve phase's %s: want all measured", d.LastHold, d.CPU, rep.Reserve.CPU)
	}
	if a := rep.After; a.Requests != after || a.Refused != after || a.CPU <= 0 {
		t.Errorf("after the sell-out: %+v, want %d requests, all refused OUT_OF_STOCK, CPU measured", a, after)
	}
	if c := rep.Ceiling; c == nil || c.Requests != after || c.Refused != after || c.CPU <= 0 {
		t.Errorf("ceiling: %+v, want %d deducts, all refused OUT_OF_STOCK, CPU measured", c, after)
	}
	for _, want := range []string{"drop: doors open to the last unit in a token: ", "drop: server CPU per granted token ", "refused RequestToken against it: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestDrop_Flags checks that model drop refuses what it cannot run: no
// stack, another target, bounds out of range; and that nothing starts.
func TestDrop_Flags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-model", "drop", "-target", "shardstock"}, "needs -stack"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "memory"}, "-target shardstock alone"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-drop-units", "0"}, "units"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-drop-release", "1.5"}, "release share"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-requests", "10"}, "arrivals"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-drop-warmup", "-1"}, "warm-up"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-drop-after-rounds", "0"}, "-drop-after-rounds 0"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-drop-after-rounds", "101"}, "rounds after the sell-out"},
		{[]string{"-model", "drop", "-stack", "/nonexistent", "-target", "shardstock", "-drop-after", "5", "-drop-after-rounds", "6"}, "rounds after the sell-out"},
	} {
		_, _, err := runArgs(t, env(nil), tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}
