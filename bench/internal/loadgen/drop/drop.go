// Package drop is loadgen's model "drop" (issue 31): a SKU of few units
// under admission (ADMISSION_MODE_TOKENS) and a crowd arriving open-loop,
// faster than the service answers, each arrival a RequestToken with a new
// key and customer. Tokens are bought with Commit after a think time, some
// released; released units go to the waitlist, whose admitted tickets are
// bought too. The model measures, on one stack in one run:
//
//   - the time from the doors opening to the last unit in a token;
//   - the server CPU from the doors opening to the last unit in a token,
//     per token granted, against the same for a plain Reserve: the same
//     arrivals, think time and releases on a second SKU of as many units
//     without admission (the reserve phase, run first);
//   - once the SKU is sold out for good, the server CPU per refused
//     RequestToken (new keys, at the same rate), against the in-memory
//     ceiling's per refused Deduct of a sold-out SKU in the same run.
//
// Both CPU windows of the first comparison hold the refusals and tickets
// answered while the units were still going: what a drop costs, per unit
// sold into a hold, through admission and without it.
package drop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	shardstockv1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// Defaults and bounds of a drop.
const (
	UnitsDefault       = 1000
	ArrivalsDefault    = 10_000
	RateDefault        = 5000 // arrivals per second
	ThinkDefault       = 200 * time.Millisecond
	ReleaseDefault     = 0.05
	WaitlistDefault    = 2000
	AfterDefault       = 5000
	InFlightMaxDefault = 1024
	ShardsDefault      = 8
	unitsMax           = 1_000_000
	arrivalsMax        = 1_000_000
	tokenTTL           = 60 * time.Second
	afterRoundsMax     = 100
	attemptsMax        = 20               // of one request whose answer left its fate unknown
	requestTimeout     = 30 * time.Second // of one attempt: a queue of in-flight RequestTokens waits long
	retryPause         = 50 * time.Millisecond
	settleMax          = 30 * time.Second // for the waitlist to be answered
	settlePoll         = 200 * time.Millisecond
	ticketReadsMax     = 16 // GetTicket calls in flight
	// stockPoll is how often a phase reads its SKU's stock, to find the
	// last unit in a hold: the resolution of that time.
	stockPoll = 20 * time.Millisecond
	// pollAfterLoad bounds the poll for the last unit in a hold once every
	// arrival is answered.
	pollAfterLoad = 10 * time.Second
)

// Config is one drop.
type Config struct {
	RunID string // makes SKU names, keys and customers unique
	// Units of each SKU; Arrivals per phase, sent at Rate a second, within
	// Duration (the first bound reached ends the phase's arrivals).
	Units    int64
	Arrivals int
	Rate     float64
	Duration time.Duration
	// Think is the time from a token (or a reservation) to its Commit or
	// Release; Release is the share released. A release waits until every
	// unit was in a hold once, so that a released unit goes to the
	// waitlist, not to a later arrival.
	Think   time.Duration
	Release float64
	// WaitlistMax is the admission's waitlistMax.
	WaitlistMax int64
	// TokensPerCustomer is the admission's tokensPerCustomer (every
	// request is a customer of its own): 0, tokens are granted directly
	// while units are free; else every request is a ticket.
	TokensPerCustomer int64
	// After is the RequestTokens sent once the SKU is sold out for good,
	// and the ceiling's refused deducts, at Rate.
	After int
	// AfterRounds splits the requests after the sell-out and the
	// ceiling's into that many slices each, which take turns, the order
	// reversed every other round (Swap gives the first round's): the
	// machine's drift over the two falls on both alike. Default 1.
	AfterRounds int
	InFlightMax int
	Shards      int32
	// Swap runs the phases of each pair the other way round: the drop
	// before the reserve phase, the ceiling before the refusals after the
	// sell-out; alternated over rounds, neither of a pair always runs on
	// what the other left (a warmer cache, a fuller database).
	Swap bool
	// Warmup is the arrivals of each kind sent, unmeasured, to a pair of
	// SKUs of Warmup/2 units (one under admission, one without) before
	// the first measured phase, so that neither measured phase pays for
	// the fresh stack's first connections, prepared statements and
	// caches (0: none). Without it the phase run first cost 20% to 80%
	// more CPU per unit than run second (docs/bench-log/2026-12-05-tokcpu.md).
	Warmup int
}

// Check fills in c's defaults (its zero fields) and checks its bounds.
func Check(c Config) (Config, error) {
	err := c.defaults()
	return c, err
}

func (c *Config) defaults() error {
	if c.Units == 0 {
		c.Units = UnitsDefault
	}
	if c.Arrivals == 0 {
		c.Arrivals = ArrivalsDefault
	}
	if c.Rate == 0 {
		c.Rate = RateDefault
	}
	if c.Duration == 0 {
		c.Duration = time.Minute
	}
	if c.InFlightMax == 0 {
		c.InFlightMax = InFlightMaxDefault
	}
	if c.Shards == 0 {
		c.Shards = ShardsDefault
	}
	if c.AfterRounds == 0 {
		c.AfterRounds = 1
	}
	switch {
	case c.RunID == "":
		return errors.New("drop: no run id")
	case c.Units < 1 || c.Units > unitsMax:
		return fmt.Errorf("drop: %d units: want 1 to %d", c.Units, unitsMax)
	case c.Arrivals < 1 || c.Arrivals > arrivalsMax || int64(c.Arrivals) < c.Units:
		return fmt.Errorf("drop: %d arrivals: want as many as the units (%d) to %d", c.Arrivals, c.Units, arrivalsMax)
	case !(c.Rate > 0 && c.Rate <= 1_000_000):
		return fmt.Errorf("drop: rate %g: want more than 0, at most 1,000,000 a second", c.Rate)
	case c.Think < 0 || c.Duration < 0 || !(c.Release >= 0 && c.Release <= 1):
		return errors.New("drop: think time and duration must not be negative, the release share 0 to 1")
	case c.WaitlistMax < 0 || c.After < 0 || c.After > arrivalsMax || c.InFlightMax < 1 || c.TokensPerCustomer < 0:
		return errors.New("drop: waitlist, after-sell-out requests and in-flight bound out of range")
	case c.AfterRounds < 1 || c.AfterRounds > afterRoundsMax || (c.After > 0 && c.After < c.AfterRounds):
		return fmt.Errorf("drop: %d rounds after the sell-out: want 1 to %d, and at most the requests after it (%d)", c.AfterRounds, afterRoundsMax, c.After)
	case c.Warmup < 0 || c.Warmup == 1 || c.Warmup > arrivalsMax:
		return fmt.Errorf("drop: %d warm-up arrivals: want 0 or 2 to %d", c.Warmup, arrivalsMax)
	}
	return nil
}

// Env is what a drop runs against: shardstock's clients and its server's
// CPU, and the in-memory ceiling (nil: not measured) with its server's CPU,
// which Ceiling's Setup starts.
type Env struct {
	Inv        shardstockv1connect.InventoryServiceClient
	Admin      shardstockv1connect.AdminServiceClient
	ServerCPU  func() (time.Duration, error)
	Ceiling    loadgen.Target
	CeilingCPU func() (time.Duration, error)
	Log        io.Writer // progress lines; nil: none
}

// Phase is the count of one phase's answers.
type Phase struct {
	Arrivals int   // requests sent
	HeldBack int   // arrivals sent late because InFlightMax were in flight
	Held     int64 // tokens (or reservations) granted in the answer (tickets admitted: Report.Admitted)
	Tickets  int64 // tickets in the waitlist
	// Refused by code: OUT_OF_STOCK, WAITLIST_FULL, ...
	Refused map[string]int64
	Errors  map[string]int64 // answers with no definite result after the retries
	// LastHold is the time from the doors opening to the first read of
	// the SKU with every unit in a hold (0: never); CPU the server's CPU
	// over that window.
	LastHold time.Duration
	CPU      time.Duration
	Released int64 // holds released after the think time
	Bought   int64 // holds committed after the think time
	Elapsed  time.Duration
}

// RefusedTotal is every refusal of the phase.
func (p *Phase) RefusedTotal() int64 {
	var n int64
	for _, v := range p.Refused {
		n += v
	}
	return n
}

// ErrorTotal is every answer without a definite result.
func (p *Phase) ErrorTotal() int64 {
	var n int64
	for _, v := range p.Errors {
		n += v
	}
	return n
}

// Window is a run of requests refused after the sell-out: their count,
// the refusals among them and the server's CPU over it.
type Window struct {
	Requests, Refused int64
	Errors            map[string]int64
	CPU, Elapsed      time.Duration
}

// add adds o's requests, answers, CPU and time to w.
func (w *Window) add(o Window) {
	w.Requests += o.Requests
	w.Refused += o.Refused
	w.CPU += o.CPU
	w.Elapsed += o.Elapsed
	for k, n := range o.Errors {
		if w.Errors == nil {
			w.Errors = map[string]int64{}
		}
		w.Errors[k] += n
	}
}

// PerRequest is the window's server CPU per request.
func (w Window) PerRequest() time.Duration {
	if w.Requests == 0 {
		return 0
	}
	return w.CPU / time.Duration(w.Requests)
}

// Report is a drop's outcome.
type Report struct {
	Config                Config
	SKU, PlainSKU         string
	Reserve, Drop         Phase
	Admitted, AdmitBuys   int64 // tickets admitted after the releases, and bought
	SoldOut, StillWaiting int64 // tickets answered SOLD_OUT; still waiting after settleMax
	Final                 *shardstockv1.Stock
	After                 Window
	Ceiling               *Window // nil: not measured
}

// PerToken is the drop's server CPU per token granted up to the last
// unit in a token (releases wait for it: the window puts Units units in
// holds);
// PerReserve the reserve phase's per reservation. 0: the phase never
// held every unit.
func (r *Report) PerToken() time.Duration   { return per(r.Drop, r.Config.Units) }
func (r *Report) PerReserve() time.Duration { return per(r.Reserve, r.Config.Units) }

func per(p Phase, units int64) time.Duration {
	if p.LastHold == 0 {
		return 0
	}
	return p.CPU / time.Duration(units)
}

// Run runs a drop: the reserve phase, the drop, the waitlist settled, the
// requests after the sell-out, then the ceiling's.
func Run(ctx context.Context, cfg Config, env Env) (*Report, error) {
	cfg, err := Check(cfg)
	if err != nil {
		return nil, err
	}
	r := &Report{Config: cfg, SKU: "drop-" + cfg.RunID, PlainSKU: "drop-plain-" + cfg.RunID}
	logf := func(format string, args ...any) {
		if env.Log != nil {
			fmt.Fprintf(env.Log, "loadgen: drop: "+format+"\n", args...)
		}
	}
	if err := createSKUs(ctx, env.Admin, cfg, r.SKU, r.PlainSKU); err != nil {
		return nil, err
	}
	if cfg.Warmup > 0 {
		if err := warmUp(ctx, cfg, env, logf); err != nil {
			return r, err
		}
	}
	reserve := reserveCall(env, cfg.RunID, r.PlainSKU)
	token := tokenCall(env, cfg.RunID, r.SKU)
	reservePhase := func() error {
		logf("reserve phase: %d arrivals at %.0f/s on %s (%d units, no admission)", cfg.Arrivals, cfg.Rate, r.PlainSKU, cfg.Units)
		var err error
		if r.Reserve, _, err = runPhase(ctx, cfg, env, r.PlainSKU, reserve); err != nil {
			return fmt.Errorf("drop: reserve phase: %w", err)
		}
		return nil
	}
	if !cfg.Swap {
		if err := reservePhase(); err != nil {
			return r, err
		}
	}
	logf("drop: %d arrivals at %.0f/s on %s (%d units, tokens, waitlist %d, tokens per customer %d)", cfg.Arrivals, cfg.Rate, r.SKU, cfg.Units, cfg.WaitlistMax, cfg.TokensPerCustomer)
	var tickets []string
	if r.Drop, tickets, err = runPhase(ctx, cfg, env, r.SKU, token); err != nil {
		return r, fmt.Errorf("drop: %w", err)
	}
	logf("settling the waitlist: %d tickets", len(tickets))
	if err := r.settle(ctx, env, tickets); err != nil {
		return r, fmt.Errorf("drop: waitlist: %w", err)
	}
	if cfg.Swap {
		if err := reservePhase(); err != nil {
			return r, err
		}
	}
	if cfg.After == 0 {
		return r, nil
	}
	// The refusals after the sell-out and the ceiling's, in AfterRounds
	// slices each, taking turns.
	after := func(from, to int) error {
		logf("after the sell-out: RequestTokens %d to %d of %d at %.0f/s", from+1, to, cfg.After, cfg.Rate)
		w, err := refusals(ctx, cfg, to-from, env.ServerCPU, func(ctx context.Context, i int) answer {
			_, a := token(ctx, cfg.Arrivals+from+i)
			return a
		})
		r.After.add(w)
		if err != nil {
			return fmt.Errorf("drop: after the sell-out: %w", err)
		}
		return nil
	}
	ceilingSKU := ""
	ceilingPhase := func(from, to int) error {
		if env.Ceiling == nil {
			return nil
		}
		logf("the ceiling: Deducts %d to %d of %d of a sold-out SKU at %.0f/s", from+1, to, cfg.After, cfg.Rate)
		if ceilingSKU == "" {
			var err error
			if ceilingSKU, err = sellOutCeiling(ctx, cfg, env); err != nil {
				return fmt.Errorf("drop: ceiling: %w", err)
			}
			r.Ceiling = &Window{}
		}
		w, err := ceiling(ctx, cfg, env, ceilingSKU, from, to)
		r.Ceiling.add(w)
		if err != nil {
			return fmt.Errorf("drop: ceiling: %w", err)
		}
		return nil
	}
	for _, tu := range afterTurns(cfg.After, cfg.AfterRounds, cfg.Swap) {
		f := after
		if tu.ceiling {
			f = ceilingPhase
		}
		if err := f(tu.from, tu.to); err != nil {
			return r, err
		}
	}
	return r, nil
}

// afterTurn is one slice of the requests after the sell-out: requests
// from to to (exclusive) of shardstock's, or of the ceiling's.
type afterTurn struct {
	ceiling  bool
	from, to int
}

// afterTurns cuts n requests of each side into rounds slices and orders
// them: each round shardstock's slice and the ceiling's, the order
// reversed every other round, the first round's reversed with swap.
func afterTurns(n, rounds int, swap bool) []afterTurn {
	var out []afterTurn
	for k := range rounds {
		from, to := k*n/rounds, (k+1)*n/rounds
		pair := []afterTurn{{false, from, to}, {true, from, to}}
		if swap != (k%2 == 1) {
			pair[0], pair[1] = pair[1], pair[0]
		}
		out = append(out, pair...)
	}
	return out
}

func createSKUs(ctx context.Context, admin shardstockv1connect.AdminServiceClient, cfg Config, sku, plain string) error {
	_, err := admin.CreateSku(ctx, connect.NewRequest(&shardstockv1.CreateSkuRequest{
		Sku: sku, InitialStock: cfg.Units, Shards: cfg.Shards,
		Admission: &shardstockv1.Admission{Mode: shardstockv1.AdmissionMode_ADMISSION_MODE_TOKENS,
			TokenTtl: durationpb.New(tokenTTL), WaitlistMax: cfg.WaitlistMax, TokensPerCustomer: cfg.TokensPerCustomer},
	}))
	if err != nil {
		return fmt.Errorf("drop: CreateSku %s: %w", sku, err)
	}
	if _, err := admin.CreateSku(ctx, connect.NewRequest(&shardstockv1.CreateSkuRequest{Sku: plain, InitialStock: cfg.Units, Shards: cfg.Shards})); err != nil {
		return fmt.Errorf("drop: CreateSku %s: %w", plain, err)
	}
	return nil
}

// reserveCall returns the reserve phase's call: a Reserve of one unit of
// sku, the i-th arrival's key and customer made unique by runID.
func reserveCall(env Env, runID, sku string) func(context.Context, int) (string, answer) {
	return func(ctx context.Context, i int) (string, answer) {
		resp, err := env.Inv.Reserve(ctx, connect.NewRequest(&shardstockv1.ReserveRequest{
			Sku: sku, Quantity: 1, IdempotencyKey: fmt.Sprintf("%s-r-%d", runID, i), CustomerRef: fmt.Sprintf("%s-rc-%d", runID, i)}))
		if err != nil {
			return "", classify(err)
		}
		return resp.Msg.GetReservation().GetReservationId(), answer{kind: answerHeld}
	}
}

// tokenCall returns the drop's call: a RequestToken of one unit of sku.
func tokenCall(env Env, runID, sku string) func(context.Context, int) (string, answer) {
	return func(ctx context.Context, i int) (string, answer) {
		resp, err := env.Inv.RequestToken(ctx, connect.NewRequest(&shardstockv1.RequestTokenRequest{
			Sku: sku, Quantity: 1, IdempotencyKey: fmt.Sprintf("%s-t-%d", runID, i), CustomerRef: fmt.Sprintf("%s-tc-%d", runID, i)}))
		if err != nil {
			return "", classify(err)
		}
		if t := resp.Msg.GetToken(); t != nil {
			return t.GetTokenId(), answer{kind: answerHeld}
		}
		return resp.Msg.GetTicket().GetTicketId(), answer{kind: answerTicket}
	}
}

// warmUp sends cfg.Warmup Reserves and as many RequestTokens, unmeasured,
// to two SKUs of their own of half as many units, buys and releases as
// the phases do, and settles the waitlist: the stack's connections,
// prepared statements and caches are then those of a stack that has sold
// before, for both measured phases alike.
func warmUp(ctx context.Context, cfg Config, env Env, logf func(string, ...any)) error {
	w := cfg
	w.RunID, w.Arrivals, w.Units = cfg.RunID+"w", cfg.Warmup, int64(cfg.Warmup/2)
	wr := &Report{Config: w, SKU: "drop-warm-" + cfg.RunID, PlainSKU: "drop-warm-plain-" + cfg.RunID}
	if err := createSKUs(ctx, env.Admin, w, wr.SKU, wr.PlainSKU); err != nil {
		return err
	}
	logf("warm-up: %d Reserves and %d RequestTokens at %.0f/s on SKUs of %d units (not measured)", w.Arrivals, w.Arrivals, w.Rate, w.Units)
	if _, _, err := runPhase(ctx, w, env, wr.PlainSKU, reserveCall(env, w.RunID, wr.PlainSKU)); err != nil {
		return fmt.Errorf("drop: warm-up: %w", err)
	}
	_, tickets, err := runPhase(ctx, w, env, wr.SKU, tokenCall(env, w.RunID, wr.SKU))
	if err != nil {
		return fmt.Errorf("drop: warm-up: %w", err)
	}
	if err := wr.settle(ctx, env, tickets); err != nil {
		return fmt.Errorf("drop: warm-up: waitlist: %w", err)
	}
	return nil
}

// answerKind is what one request got.
type answerKind uint8

const (
	answerHeld    answerKind = iota + 1 // a token or a reservation
	answerTicket                        // a ticket in the waitlist
	answerRefused                       // a definite refusal (code)
	answerError                         // no definite answer (code)
)

type answer struct {
	kind answerKind
	code string
}

// classify names an error answer: a definite refusal by its reason, else
// an error whose fate is unknown.
func classify(err error) answer {
	code := wire.Reason(err)
	if code == "" {
		code = connect.CodeOf(err).String()
	}
	c := stock.Code(code)
	if c.Definite() && !c.Retryable() {
		return answer{kind: answerRefused, code: code}
	}
	return answer{kind: answerError, code: code}
}

// send calls do until a definite answer (the same key each time), at
// most attemptsMax times, each within requestTimeout.
func send[T any](ctx context.Context, do func(context.Context) (T, answer)) (T, answer) {
	var v T
	var a answer
	for range attemptsMax {
		actx, cancel := context.WithTimeout(ctx, requestTimeout)
		v, a = do(actx)
		cancel()
		if a.kind != answerError || ctx.Err() != nil {
			return v, a
		}
		select {
		case <-ctx.Done():
			return v, a
		case <-time.After(retryPause):
		}
	}
	return v, a
}

// runPhase sends the arrivals of one phase open-loop and waits for every
// answer and every hold's commit or release; it returns the counts and the
// tickets answered.
func runPhase(ctx context.Context, cfg Config, env Env, sku string, call func(context.Context, int) (string, answer)) (Phase, []string, error) {
	p := Phase{Refused: map[string]int64{}, Errors: map[string]int64{}}
	var (
		mu       sync.Mutex
		tickets  []string
		held     atomic.Int64
		allHeld  = make(chan struct{}) // closed at the Units-th hold
		loadDone = make(chan struct{})
		holds    sync.WaitGroup
		cpuErr   error
	)
	cpu0, err := env.ServerCPU()
	if err != nil {
		return p, nil, err
	}
	start := time.Now()
	// end buys or releases the n-th hold (from 1): released when
	// n*Release passes a whole number, an even spread of the share.
	end := func(id string, n int64) {
		defer holds.Done()
		time.Sleep(cfg.Think)
		release := math.Floor(float64(n)*cfg.Release) > math.Floor(float64(n-1)*cfg.Release)
		if release {
			select {
			case <-allHeld:
			case <-loadDone:
			}
		}
		_, a := send(ctx, func(ctx context.Context) (struct{}, answer) {
			var err error
			if release {
				_, err = env.Inv.Release(ctx, connect.NewRequest(&shardstockv1.ReleaseRequest{ReservationId: id, Reason: "drop: a buyer leaves"}))
			} else {
				_, err = env.Inv.Commit(ctx, connect.NewRequest(&shardstockv1.CommitRequest{ReservationId: id}))
			}
			if err != nil {
				return struct{}{}, classify(err)
			}
			return struct{}{}, answer{kind: answerHeld}
		})
		mu.Lock()
		defer mu.Unlock()
		switch {
		case a.kind != answerHeld:
			p.Errors["end: "+a.code]++
		case release:
			p.Released++
		default:
			p.Bought++
		}
	}
	arrive := func(ctx context.Context, i int) {
		id, a := send(ctx, func(ctx context.Context) (string, answer) { return call(ctx, i) })
		if a.kind == answerHeld {
			holds.Add(1)
			go end(id, held.Add(1))
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch a.kind {
		case answerTicket:
			p.Tickets++
			tickets = append(tickets, id)
		case answerRefused:
			p.Refused[a.code]++
		default:
			p.Errors[a.code]++
		}
	}
	// The poll: the first GetStock that finds nothing available and
	// nothing in transit is the last unit in a hold (a token, or a ticket
	// admitted at once: a ticket may be answered while a unit is promised
	// to a request in flight, docs/admission.md).
	// It goes on for at most pollAfterLoad once the arrivals are all
	// answered: a drop that ends within one poll (a few units, a fast
	// machine) is still seen held, at the poll after its end.
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		done, giveUp := loadDone, (<-chan time.Time)(nil)
		for {
			resp, err := env.Inv.GetStock(ctx, connect.NewRequest(&shardstockv1.GetStockRequest{Sku: sku}))
			if err == nil && resp.Msg.GetStock().GetAvailable() == 0 && resp.Msg.GetStock().GetInTransit() == 0 {
				c, err := env.ServerCPU()
				mu.Lock()
				p.LastHold, p.CPU, cpuErr = time.Since(start), c-cpu0, err
				mu.Unlock()
				close(allHeld)
				return
			}
			select {
			case <-done:
				done, giveUp = nil, time.After(pollAfterLoad)
			case <-giveUp:
				return
			case <-ctx.Done():
				return
			case <-time.After(stockPoll):
			}
		}
	}()
	p.Arrivals, p.HeldBack = openLoop(ctx, cfg, cfg.Arrivals, arrive)
	close(loadDone)
	<-polled
	holds.Wait()
	p.Elapsed = time.Since(start)
	p.Held = held.Load()
	if cpuErr != nil {
		return p, tickets, cpuErr
	}
	return p, tickets, ctx.Err()
}

// openLoop calls do for n arrivals, the i-th due at i/rate after the start,
// each in a goroutine of its own, at most InFlightMax at once, within
// Duration; it returns once every call returned, with the arrivals sent
// and how many were sent late because InFlightMax were in flight.
func openLoop(ctx context.Context, cfg Config, n int, do func(context.Context, int)) (sent, heldBack int) {
	slots := make(chan struct{}, cfg.InFlightMax)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for i := range n {
		due := start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
		if due.After(deadline) || ctx.Err() != nil {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		select {
		case slots <- struct{}{}:
		default:
			heldBack++
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			do(ctx, i)
		}()
	}
	wg.Wait()
	return sent, heldBack
}

// settle waits, up to settleMax, until the SKU holds nothing and every
// ticket is answered: an ADMITTED ticket's token is bought.
func (r *Report) settle(ctx context.Context, env Env, tickets []string) error {
	deadline := time.Now().Add(settleMax)
	waiting := tickets
	for {
		var mu sync.Mutex
		var still []string
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(ticketReadsMax)
		for _, id := range waiting {
			g.Go(func() error {
				resp, err := env.Inv.GetTicket(gctx, connect.NewRequest(&shardstockv1.GetTicketRequest{TicketId: id}))
				if err != nil {
					if a := classify(err); a.kind == answerError {
						mu.Lock()
						still = append(still, id)
						mu.Unlock()
						return nil
					}
					return fmt.Errorf("GetTicket %s: %w", id, err)
				}
				t := resp.Msg.GetTicket()
				switch t.GetState() {
				case shardstockv1.TicketState_TICKET_STATE_ADMITTED:
					_, a := send(gctx, func(ctx context.Context) (struct{}, answer) {
						_, err := env.Inv.Commit(ctx, connect.NewRequest(&shardstockv1.CommitRequest{ReservationId: t.GetToken().GetTokenId()}))
						if err != nil {
							return struct{}{}, classify(err)
						}
						return struct{}{}, answer{kind: answerHeld}
					})
					mu.Lock()
					r.Admitted++
					if a.kind == answerHeld {
						r.AdmitBuys++
					}
					mu.Unlock()
				case shardstockv1.TicketState_TICKET_STATE_SOLD_OUT:
					mu.Lock()
					r.SoldOut++
					mu.Unlock()
				case shardstockv1.TicketState_TICKET_STATE_WAITING:
					mu.Lock()
					still = append(still, id)
					mu.Unlock()
				default:
					return fmt.Errorf("ticket %s is %s", id, t.GetState())
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		waiting = still
		resp, err := env.Inv.GetStock(ctx, connect.NewRequest(&shardstockv1.GetStockRequest{Sku: r.SKU}))
		if err != nil {
			return fmt.Errorf("GetStock %s: %w", r.SKU, err)
		}
		r.Final = resp.Msg.GetStock()
		s := r.Final
		if len(waiting) == 0 && s.GetAvailable() == 0 && s.GetReserved() == 0 && s.GetInTransit() == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			r.StillWaiting = int64(len(waiting))
			return fmt.Errorf("after %s: %d tickets still waiting; the SKU has %d available, %d held, %d in transit",
				settleMax, len(waiting), s.GetAvailable(), s.GetReserved(), s.GetInTransit())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settlePoll):
		}
	}
}

// refusals sends n requests open-loop and reads the server's CPU over
// them.
func refusals(ctx context.Context, cfg Config, n int, cpu func() (time.Duration, error), call func(context.Context, int) answer) (Window, error) {
	w := Window{Errors: map[string]int64{}}
	var mu sync.Mutex
	c0, err := cpu()
	if err != nil {
		return w, err
	}
	start := time.Now()
	sent, _ := openLoop(ctx, cfg, n, func(ctx context.Context, i int) {
		_, a := send(ctx, func(ctx context.Context) (struct{}, answer) { return struct{}{}, call(ctx, i) })
		mu.Lock()
		defer mu.Unlock()
		if a.kind == answerRefused && a.code == string(stock.CodeOutOfStock) {
			w.Refused++
		} else {
			w.Errors[fmt.Sprint(a.kind, " ", a.code)]++
		}
	})
	c1, err := cpu()
	w.Requests, w.CPU, w.Elapsed = int64(sent), c1-c0, time.Since(start)
	return w, err
}

// sellOutCeiling sets the in-memory ceiling up with a SKU of one unit and
// sells it, and returns the SKU.
func sellOutCeiling(ctx context.Context, cfg Config, env Env) (string, error) {
	sku := "drop-ceiling-" + cfg.RunID
	if err := env.Ceiling.Setup(ctx, []loadgen.SKUSpec{{SKU: sku, Stock: 1, Shards: cfg.Shards}}); err != nil {
		return "", err
	}
	if o := env.Ceiling.Deduct(ctx, sku, cfg.RunID+"-c-sellout", 1); o.Status != loadgen.StatusOK {
		return "", fmt.Errorf("selling the ceiling's SKU out: %s", o)
	}
	return sku, nil
}

// ceiling measures the in-memory ceiling's CPU per refused Deduct of the
// sold-out sku, with new keys from to to, at the drop's rate.
func ceiling(ctx context.Context, cfg Config, env Env, sku string, from, to int) (Window, error) {
	return refusals(ctx, cfg, to-from, env.CeilingCPU, func(ctx context.Context, i int) answer {
		switch o := env.Ceiling.Deduct(ctx, sku, fmt.Sprintf("%s-c-%d", cfg.RunID, from+i), 1); o.Status {
		case loadgen.StatusOutOfStock:
			return answer{kind: answerRefused, code: string(stock.CodeOutOfStock)}
		case loadgen.StatusError:
			return answer{kind: answerRefused, code: o.Code}
		default:
			return answer{kind: answerHeld}
		}
	})
}

// Write prints the report.
func (r *Report) Write(w io.Writer) {
	c := r.Config
	ph := func(name string, p *Phase, hold string) {
		fmt.Fprintf(w, "drop: %s: %d arrivals at %.0f/s (%d sent late, %d in flight at most), %d %s, %d tickets, %d refused %v, %d without a definite answer %v; then %d bought, %d released; all answered and ended in %s\n",
			name, p.Arrivals, c.Rate, p.HeldBack, c.InFlightMax, p.Held, hold, p.Tickets, p.RefusedTotal(), p.Refused, p.ErrorTotal(), p.Errors, p.Bought, p.Released, p.Elapsed.Round(time.Millisecond))
	}
	order := "the reserve phase first, shardstock's refusals before the ceiling's"
	if c.Swap {
		order = "swapped: the drop first, the ceiling's refusals before shardstock's"
	}
	fmt.Fprintf(w, "drop: %d units a SKU, %d shards; think %s, %.0f%% released; waitlist %d; %s\n", c.Units, c.Shards, c.Think, c.Release*100, c.WaitlistMax, order)
	ph("reserve phase (no admission)", &r.Reserve, "reservations")
	ph("drop (tokens)", &r.Drop, "tokens")
	fmt.Fprintf(w, "drop: waitlist: %d admitted (units promised to a request in flight when it was answered, then the releases), %d of them bought; %d answered SOLD_OUT; %d still waiting\n",
		r.Admitted, r.AdmitBuys, r.SoldOut, r.StillWaiting)
	if s := r.Final; s != nil {
		fmt.Fprintf(w, "drop: final: %d sold, %d available, %d held, %d in transit\n", s.GetSold(), s.GetAvailable(), s.GetReserved(), s.GetInTransit())
	}
	fmt.Fprintf(w, "drop: doors open to the last unit in a token: %s (plain Reserve: to the last unit held %s)\n",
		r.Drop.LastHold.Round(time.Millisecond), r.Reserve.LastHold.Round(time.Millisecond))
	fmt.Fprintf(w, "drop: server CPU per granted token %s (%s over the window / %d), per plain reservation %s: %s\n",
		r.PerToken().Round(time.Microsecond), r.Drop.CPU.Round(time.Millisecond), c.Units, r.PerReserve().Round(time.Microsecond), ratio(r.PerToken(), r.PerReserve()))
	if c.After > 0 {
		fmt.Fprintf(w, "drop: after the sell-out: %d RequestTokens, %d refused OUT_OF_STOCK, others %v: server CPU per request %s\n",
			r.After.Requests, r.After.Refused, r.After.Errors, r.After.PerRequest().Round(time.Microsecond))
	}
	if r.Ceiling != nil {
		fmt.Fprintf(w, "drop: the ceiling: %d Deducts of a sold-out SKU, %d refused: server CPU per request %s; refused RequestToken against it: %s\n",
			r.Ceiling.Requests, r.Ceiling.Refused, r.Ceiling.PerRequest().Round(time.Microsecond), ratio(r.After.PerRequest(), r.Ceiling.PerRequest()))
	}
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "no ratio"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}
