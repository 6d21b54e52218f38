package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/schollz/progressbar/v3"
)

// Limits of a run. Every load loop is bounded by a count and by time.
const (
	requestsMax     = 10_000_000 // client operations per run, whatever -requests says
	durationMax     = time.Hour  // load time per run, whatever -duration says
	concurrencyMax  = 4096
	rateMax         = 1_000_000 // client operations started per second
	skusMax         = 100_000
	drainGrace      = 10 * time.Second // for flows in flight when load stops: commit steps and retries
	retriesMax      = 20               // retries of a request until a definite answer
	abandonDelayMin = 50 * time.Microsecond
	abandonDelayMax = 100 * time.Millisecond
	// abandonRetryDelay is the pause before the first retry of an abandoned
	// request (see send).
	abandonRetryDelay = 20 * time.Millisecond
	retryBackoffMin   = time.Millisecond
	retryBackoffMax   = 100 * time.Millisecond
	setupTimeout      = 5 * time.Minute
	verifyTimeout     = 5 * time.Minute
	progressInterval  = 200 * time.Millisecond

	requestTimeoutDefault = 10 * time.Second
)

// Config is a run's parameters. Zero values take the defaults noted.
type Config struct {
	Model Model // default A
	SKUs  int   // models A, B, C; default 1000
	// Stock per SKU (default 1,000,000); the hot SKU of model C and the SKU
	// of the case always have 100.
	Stock  int64
	Shards int32 // shards (sub-rows) per SKU; default 1
	// Duration bounds the load time (default 10 s, at most an hour);
	// Requests bounds the number of client operations (a reserve and its
	// commit count as one; duplicates and retries do not count). The run
	// stops at whichever comes first. The case model always has 500.
	Duration    time.Duration
	Requests    int64
	Concurrency int // clients; default 64
	// Rate, when positive, bounds how many client operations start per
	// second, over all clients (a deduct, or a reserve with its commit or
	// release, is one): to measure latency below the peak. 0: each client
	// starts its next operation as soon as the last one ended.
	Rate float64
	Qty  QtyDist // default 1
	Mix  Mix     // default deduct only
	// DupRate is the share of requests sent twice at once with the same key.
	DupRate float64
	// AbandonRate is the share of requests whose client cancels right after
	// sending and retries with the same key until a definite answer.
	AbandonRate float64
	// Retry makes every client do what the API asks of one: a request whose
	// answer left its fate unknown (a timeout, SHARD_UNAVAILABLE, INTERNAL)
	// or that was refused for now (RATE_LIMITED) is sent again with the
	// same key, with backoff, until a definite answer or retriesMax
	// retries. Abandoned requests are retried that way whether or not Retry
	// is set. Without Retry, an unknown fate leaves its SKU out of the
	// client-against-system check.
	Retry          bool
	RequestTimeout time.Duration // per attempt; default 10 s
	Seed           uint64        // of every random choice; default 1
	// RunID makes SKU names and keys unique; random when empty.
	RunID string
	// Progress, when set, receives a progress bar (stderr in the command).
	Progress io.Writer
	// LoadStarted, when set, is called as the load begins, after Setup: to
	// start server-side profiles over the load alone; LoadEnded as it
	// ends, before Verify.
	LoadStarted, LoadEnded func()
	// LatencyGoal, when positive, keeps the answers slower than it in
	// Result.Slow (up to slowMax/Concurrency per client), so that they can
	// be matched against what else happened meanwhile (Result.MatchSlow).
	LatencyGoal time.Duration
}

func (c Config) withDefaults() Config {
	if c.Model == "" {
		c.Model = ModelA
	}
	if c.SKUs == 0 {
		c.SKUs = 1000
	}
	if c.Stock == 0 {
		c.Stock = 1_000_000
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Qty == (QtyDist{}) {
		c.Qty = QtyDist{Min: 1, Max: 1}
	}
	if c.Mix == (Mix{}) {
		c.Mix = Mix{Deduct: 1}
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = requestTimeoutDefault
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.RunID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.RunID = hex.EncodeToString(b[:])
	}
	if c.Model == ModelCase {
		c.SKUs, c.Stock, c.Requests, c.Qty, c.Mix = 1, CaseStock, CaseRequests, QtyDist{Min: 1, Max: 1}, Mix{Deduct: 1}
	}
	return c
}

func (c Config) validate() error {
	if _, err := ParseModel(string(c.Model)); err != nil {
		return err
	}
	switch {
	case c.Model == ModelDrop:
		return errors.New("loadgen: the runner does not run model drop (package drop does)")
	case c.SKUs < 1 || c.SKUs > skusMax:
		return fmt.Errorf("loadgen: skus %d: want 1 to %d", c.SKUs, skusMax)
	case c.Stock < 1:
		return fmt.Errorf("loadgen: stock %d: want >= 1", c.Stock)
	case c.Shards < 1 || c.Shards > 256:
		return fmt.Errorf("loadgen: shards %d: want 1 to 256", c.Shards)
	case c.Duration < 0 || c.Duration > durationMax:
		return fmt.Errorf("loadgen: duration %s: want at most %s", c.Duration, durationMax)
	case c.Requests < 0 || c.Requests > requestsMax:
		return fmt.Errorf("loadgen: requests %d: want at most %d", c.Requests, requestsMax)
	case c.Concurrency < 1 || c.Concurrency > concurrencyMax:
		return fmt.Errorf("loadgen: concurrency %d: want 1 to %d", c.Concurrency, concurrencyMax)
	case !(c.Rate >= 0 && c.Rate <= rateMax): // NaN too
		return fmt.Errorf("loadgen: rate %g: want 0 (unpaced) to %d operations per second", c.Rate, rateMax)
	case c.DupRate < 0 || c.DupRate > 1:
		return fmt.Errorf("loadgen: dup rate %g: want 0 to 1", c.DupRate)
	case c.AbandonRate < 0 || c.AbandonRate > 1:
		return fmt.Errorf("loadgen: abandon rate %g: want 0 to 1", c.AbandonRate)
	case c.RequestTimeout < 0:
		return fmt.Errorf("loadgen: request timeout %s: want > 0", c.RequestTimeout)
	case c.Model == ModelCart && c.SKUs < CartLinesMax:
		return fmt.Errorf("loadgen: skus %d: the cart model needs at least %d", c.SKUs, CartLinesMax)
	case c.LatencyGoal < 0:
		return fmt.Errorf("loadgen: latency goal %s: want > 0, or 0 for none", c.LatencyGoal)
	}
	if err := c.Qty.validate(); err != nil {
		return err
	}
	return c.Mix.validate()
}

// Runner drives targets with one configuration: every target of a
// comparison sees the same SKUs and the same random sequence.
type Runner struct {
	cfg  Config
	plan plan
}

// NewRunner checks cfg, fills in its defaults and lays out the SKUs.
func NewRunner(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Runner{cfg: cfg, plan: newPlan(cfg)}, nil
}

// Config returns the configuration with its defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// SKUs returns the SKUs of the run.
func (r *Runner) SKUs() []SKUSpec { return append([]SKUSpec(nil), r.plan.skus...) }

// Result is the outcome of one run on one target.
type Result struct {
	Target   string
	Baseline bool
	Config   Config
	SKUs     []SKUSpec
	// Started is when the load began; for a run in windows (Session),
	// the last window's start less the windows before it: answers' times
	// (Slow) are from it as if the windows were one stretch, not on the
	// wall clock.
	Started time.Time
	// Elapsed is the load time, from the first request to the last answer;
	// SetupTime and VerifyTime are the times of Setup and Verify.
	Elapsed, SetupTime, VerifyTime time.Duration
	// Flows counts client operations; Requests counts every request sent,
	// duplicates and retries included. Requests = OK + Replayed +
	// OutOfStock + Errors.
	Flows                              int64
	Requests, OK, Replayed, OutOfStock int64
	Errors                             int64
	ErrorsByCode                       map[string]int64
	ErrorSamples                       map[string]string // a message of each code, when the target gave one
	RequestsByOp                       map[string]int64
	// Latency holds every answer but abandoned ones, in microseconds;
	// OutOfStockLatency only the out-of-stock answers.
	Latency, OutOfStockLatency *hdrhistogram.Histogram
	Seconds                    []Second
	// Slow are the answers over Config.LatencyGoal (abandoned ones aside),
	// in no particular order; SlowDropped counts those past a client's
	// share of slowMax, not kept.
	Slow        []Span
	SlowDropped int64
	// Disk is what a disk probe saw during the run, when one ran.
	Disk *Disk
	// Crashes is what a database crash loop did during the load, when one
	// ran.
	Crashes *Crashes
	// CPU is the CPU time the server side and the client spent over the
	// load, when it was measured.
	CPU *CPU
	// Cart is what the cart model's clients saw; nil for other models.
	Cart        *CartStats
	State       State
	Correctness Correctness
}

// Throughput is requests answered per second of load.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// FlowRate is client operations finished per second of load: the unit of
// Config.Rate.
func (r *Result) FlowRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Flows) / r.Elapsed.Seconds()
}

// Failed reports whether the run broke a correctness rule and is not a
// baseline (a baseline may oversell or duplicate: it is reported as it is).
func (r *Result) Failed() bool { return !r.Baseline && !r.Correctness.Clean() }

// Run sets t up, drives it, verifies its final state and returns what
// happened. It does not close t. A cancelled ctx stops the load early; the
// final state is still read.
func (r *Runner) Run(ctx context.Context, t Target) (*Result, error) {
	s, err := r.Start(ctx, t)
	if err != nil {
		return nil, err
	}
	s.Load(ctx, r.cfg.Duration)
	return s.Finish(ctx)
}

// A Session is one target's run taken in windows, so that targets can
// take turns on the machine (loadgen -interleave): Start sets the target
// up, each Load drives it for a window, going on where the last one
// stopped (the same clients, random sequence and keys), and Finish
// verifies it. Its Result covers every window: Elapsed is their sum, and
// the times in it run on across windows as if they were one.
type Session struct {
	r         *Runner
	ru        *run
	ot        OrderTarget
	setupTime time.Duration
	workers   []*worker
}

// Start sets t up for a run in windows. It does not close t.
func (r *Runner) Start(ctx context.Context, t Target) (*Session, error) {
	ot, orders := t.(OrderTarget)
	if r.cfg.Model == ModelCart && !orders {
		return nil, fmt.Errorf("loadgen: %s: model cart: not supported (the target takes no orders)", t.Name())
	}
	setupStart := time.Now()
	setupCtx, cancel := context.WithTimeout(ctx, setupTimeout)
	err := t.Setup(setupCtx, r.SKUs())
	cancel()
	setupTime := time.Since(setupStart)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %s: setup: %w", t.Name(), err)
	}
	ru := &run{cfg: r.cfg, plan: r.plan, target: t, pace: newPacer(r.cfg.Rate)}
	ru.limit = r.cfg.Requests
	if ru.limit == 0 {
		ru.limit = requestsMax
	}
	if r.plan.fixed != nil {
		ru.limit = int64(len(r.plan.fixed))
	}
	return &Session{r: r, ru: ru, ot: ot, setupTime: setupTime}, nil
}

// Load drives the target for at most d, calling the Config's LoadStarted
// and LoadEnded around it, and reports whether operations are left to
// start (false once the run's count is done).
func (s *Session) Load(ctx context.Context, d time.Duration) bool {
	ru := s.ru
	if s.workers == nil {
		s.workers = make([]*worker, ru.cfg.Concurrency)
		for i := range s.workers {
			s.workers[i] = &worker{rng: mrand.New(mrand.NewPCG(ru.cfg.Seed, uint64(i)+1)), t: newTally(ru.cfg.LatencyGoal, slowMax/ru.cfg.Concurrency)}
		}
	}
	ru.load(ctx, s.workers, d)
	return ru.next.Load() < ru.limit
}

// Finish verifies the target's final state and returns the run's Result.
func (s *Session) Finish(ctx context.Context) (*Result, error) {
	r, ru, t := s.r, s.ru, s.ru.target
	total := newTally(ru.cfg.LatencyGoal, slowMax)
	for _, w := range s.workers {
		total.merge(w.t)
	}

	verifyStart := time.Now()
	verifyCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verifyTimeout)
	var lookups map[string]orderLookup
	var err error
	if r.cfg.Model == ModelCart {
		lookups, err = settleOrders(verifyCtx, s.ot, total.carts)
	}
	var state State
	if err == nil {
		state, err = t.Verify(verifyCtx, r.SKUs())
	}
	cancel()
	verifyTime := time.Since(verifyStart)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %s: verify: %w", t.Name(), err)
	}
	res := &Result{
		Target:            t.Name(),
		Baseline:          IsBaseline(t),
		Config:            r.cfg,
		SKUs:              r.SKUs(),
		Started:           ru.start,
		Elapsed:           ru.elapsed,
		SetupTime:         s.setupTime,
		VerifyTime:        verifyTime,
		Flows:             ru.done.Load(),
		Requests:          total.requests,
		OK:                total.ok,
		Replayed:          total.replayed,
		OutOfStock:        total.oos,
		Errors:            total.errors,
		ErrorsByCode:      total.errorsByCode,
		ErrorSamples:      total.errorSamples,
		RequestsByOp:      map[string]int64{},
		Latency:           total.latency,
		OutOfStockLatency: total.oosLatency,
		Seconds:           total.seconds,
		Slow:              total.slow,
		SlowDropped:       total.slowDropped,
		State:             state,
		Correctness:       assess(r.plan.skus, total, state),
	}
	if r.cfg.Model == ModelCart {
		res.Correctness = assessCart(r.plan.skus, total.carts, state, lookups)
		res.Cart = cartStats(total.carts)
	}
	for op, n := range total.byOp {
		if n > 0 {
			res.RequestsByOp[opKind(op).String()] = n
		}
	}
	return res, nil
}

// run is one run of one target.
type run struct {
	cfg    Config
	plan   plan
	target Target
	pace   *pacer // nil: unpaced
	limit  int64
	next   atomic.Int64 // client operations started
	done   atomic.Int64 // client operations finished
	// start is when the load began, less the windows before the current
	// one (Session): answers' times run on from window to window.
	start   time.Time
	elapsed time.Duration // of every window so far
}

// load drives the target with workers for d, or until the count runs out,
// between the Config's LoadStarted and LoadEnded.
func (ru *run) load(ctx context.Context, workers []*worker, d time.Duration) {
	if ru.cfg.LoadStarted != nil {
		ru.cfg.LoadStarted()
	}
	began := time.Now()
	ru.start = began.Add(-ru.elapsed)
	// loadCtx bounds when a client may start a new operation; drainCtx lets
	// operations in flight finish their commit step and retries.
	loadCtx, cancelLoad := context.WithDeadline(ctx, began.Add(d))
	defer cancelLoad()
	drainCtx, cancelDrain := context.WithDeadline(ctx, began.Add(d+drainGrace))
	defer cancelDrain()

	stopProgress := ru.progress()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { ru.work(loadCtx, drainCtx, w) })
	}
	wg.Wait()
	ru.elapsed += time.Since(began)
	stopProgress()
	if ru.cfg.LoadEnded != nil {
		ru.cfg.LoadEnded()
	}
}

// progress shows a progress bar until the returned func is called: by
// operations when the run is bounded by count, else by time.
func (ru *run) progress() (stop func()) {
	if ru.cfg.Progress == nil {
		return func() {}
	}
	byCount := ru.cfg.Requests > 0 || ru.plan.fixed != nil
	total := ru.cfg.Duration.Milliseconds()
	if byCount {
		total = ru.limit
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(ru.cfg.Progress),
		progressbar.OptionSetDescription(ru.target.Name()),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(progressInterval),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionClearOnFinish(),
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(progressInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				n := ru.done.Load()
				if byCount {
					_ = bar.Set64(n)
				} else {
					_ = bar.Set64(min(time.Since(ru.start).Milliseconds(), total))
				}
				bar.Describe(fmt.Sprintf("%s: %d ops", ru.target.Name(), n))
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		_ = bar.Finish()
	}
}

// work is one client: it runs operations one after the other.
func (ru *run) work(loadCtx, drainCtx context.Context, w *worker) {
	for loadCtx.Err() == nil {
		if !ru.pace.wait(loadCtx) {
			return
		}
		n := ru.next.Add(1) - 1
		if n >= ru.limit {
			return
		}
		if ru.cfg.Model == ModelCart {
			ru.doCart(drainCtx, w, ru.cartAt(n, w.rng))
		} else {
			ru.do(drainCtx, w, ru.flowAt(n, w.rng))
		}
		ru.done.Add(1)
	}
}

// pacer spaces the starts of client operations 1/rate apart over all
// clients: a token bucket one token deep. A client that finds its slot
// already passed starts at once, so no backlog builds up (and no burst
// follows) while the target is slower than the rate.
type pacer struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time
}

// newPacer returns a pacer of rate operations per second, or nil for 0.
func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return nil
	}
	return &pacer{interval: max(time.Duration(float64(time.Second)/rate), 1)}
}

// wait blocks until the caller's slot, and reports false if ctx ended
// first. A nil pacer lets every caller through.
func (p *pacer) wait(ctx context.Context) bool {
	if p == nil {
		return ctx.Err() == nil
	}
	p.mu.Lock()
	slot := time.Now()
	if p.next.After(slot) {
		slot = p.next
	}
	p.next = slot.Add(p.interval)
	p.mu.Unlock()
	d := time.Until(slot)
	if d <= 0 {
		return ctx.Err() == nil
	}
	return Sleep(ctx, d)
}

func (ru *run) flowAt(n int64, r *mrand.Rand) flow {
	if ru.plan.fixed != nil {
		return ru.plan.fixed[n]
	}
	return flow{
		kind: ru.cfg.Mix.draw(r),
		sku:  ru.plan.pick(r),
		key:  ru.plan.key(fmt.Sprintf("%s-%d", ru.cfg.RunID, n)),
		qty:  ru.cfg.Qty.draw(r),
	}
}

// do runs one client operation.
func (ru *run) do(ctx context.Context, w *worker, f flow) {
	t := ru.target
	sku := ru.plan.skus[f.sku].SKU
	if f.kind == flowDeduct {
		s := ru.send(ctx, w, opDeduct, f, func(ctx context.Context) (string, Outcome) {
			return "", t.Deduct(ctx, sku, f.key, f.qty)
		})
		w.t.keyed(f, opDeduct, s)
		return
	}
	s := ru.send(ctx, w, opReserve, f, func(ctx context.Context) (string, Outcome) {
		return t.Reserve(ctx, sku, f.key, f.qty)
	})
	w.t.keyed(f, opReserve, s)
	if s.id == "" {
		return
	}
	op, call := opCommit, t.Commit
	if f.kind == flowRelease {
		op, call = opRelease, t.Release
	}
	e := ru.send(ctx, w, op, f, func(ctx context.Context) (string, Outcome) { return "", call(ctx, s.id) })
	w.t.ended(f, s.id, op, e)
}

// sent is what one client operation's attempts came to.
type sent struct {
	ok, replayed int32
	// settled: some attempt's answer told the operation's fate for certain
	// (not a timeout, and not a refusal such as RATE_LIMITED that says
	// nothing of an earlier attempt).
	settled bool
	id      string        // a granted reservation's id
	end     time.Duration // when the last settling answer came
}

func (s *sent) add(a answer) {
	switch a.o.Status {
	case StatusOK:
		s.ok++
	case StatusReplayed:
		s.replayed++
	}
	if a.o.Definite() && !a.o.retryable() {
		s.settled = true
		s.end = max(s.end, a.end)
	}
	if s.id == "" && (a.o.Status == StatusOK || a.o.Status == StatusReplayed) {
		s.id = a.id
	}
}

// send performs one request with the faults drawn for it: maybe a duplicate
// sent at the same time with the same key, maybe abandoned right after
// sending and retried with the same key until a definite answer (with
// Retry, so is any request whose answer left its fate unknown).
func (ru *run) send(ctx context.Context, w *worker, op opKind, f flow, call func(context.Context) (string, Outcome)) sent {
	abandon := ru.cfg.AbandonRate > 0 && w.rng.Float64() < ru.cfg.AbandonRate
	dup := ru.cfg.DupRate > 0 && w.rng.Float64() < ru.cfg.DupRate
	var dupAnswer chan answer
	if dup {
		dupAnswer = make(chan answer, 1)
		go func() { dupAnswer <- ru.attempt(ctx, call, -1) }()
	}
	// An abandoned request is cancelled when the target says it is sent, or
	// at a random moment of a typical request's life, whichever is first.
	delay := time.Duration(-1)
	if abandon {
		delay = time.Duration(w.rng.Int64N(int64(min(max(w.typical, abandonDelayMin), abandonDelayMax))))
	}
	var s sent
	record := func(a answer) {
		w.t.attempt(op, f.sku, f.qty, a)
		s.add(a)
		if !a.abandoned {
			w.typical += (a.end - a.start - w.typical) / 8
		}
	}
	record(ru.attempt(ctx, call, delay))
	if dup {
		record(<-dupAnswer)
	}
	backoff := retryBackoffMin
	if abandon {
		// Give the abandoned request time to reach the system before its
		// retry: a target may send it on after the client stopped
		// listening (the Redis baselines do), and a retry that overtook it
		// could be refused while the original then applies unseen.
		backoff = abandonRetryDelay
	}
	for i := 0; (abandon || ru.cfg.Retry) && !s.settled && i < retriesMax; i++ {
		if !Sleep(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, retryBackoffMax)
		record(ru.attempt(ctx, call, -1))
	}
	return s
}

// attempt sends one request. With abandonAfter >= 0 the client cancels it as
// soon as the target reports it sent, or after abandonAfter at the latest.
func (ru *run) attempt(ctx context.Context, call func(context.Context) (string, Outcome), abandonAfter time.Duration) answer {
	ctx, cancel := context.WithTimeout(ctx, ru.cfg.RequestTimeout)
	defer cancel()
	if abandonAfter >= 0 {
		var abandon context.CancelFunc
		ctx, abandon = withAbandon(ctx)
		t := time.AfterFunc(abandonAfter, abandon)
		defer t.Stop()
	}
	start := time.Since(ru.start)
	id, o := call(ctx)
	a := answer{o: o, id: id, start: start, end: time.Since(ru.start)}
	if abandonAfter >= 0 && o.Status == StatusError && errors.Is(ctx.Err(), context.Canceled) {
		a.o, a.abandoned = Error(CodeAbandoned), true
	}
	return a
}

// Sleep waits d or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// keyed records what became of a deduct or reserve key.
func (t *tally) keyed(f flow, op opKind, s sent) {
	id := keyID{sku: f.sku, key: f.key}
	k, ok := t.keys[id]
	if !ok {
		k = &keyObs{op: op, qty: f.qty}
		t.keys[id] = k
	}
	k.ok += s.ok
	k.replayed += s.replayed
	k.unresolved = k.unresolved || !s.settled
	if k.id == "" {
		k.id = s.id
	}
}

// ended records what became of a commit or release of reservation id.
func (t *tally) ended(f flow, id string, op opKind, s sent) {
	r, ok := t.reservations[id]
	if !ok {
		r = &resObs{sku: f.sku, key: f.key, qty: f.qty}
		t.reservations[id] = r
	}
	if op == opCommit {
		r.commitOK += s.ok
		r.commitRepl += s.replayed
	} else {
		r.releaseOK += s.ok
		r.releaseRpl += s.replayed
		// A release that may have happened returned stock at the latest when
		// its definite answer came, or at some unknown time.
		if s.ok > 0 || s.replayed > 0 || !s.settled {
			end := s.end
			if !s.settled {
				end = neverEnds
			}
			t.releases = append(t.releases, releaseEvent{sku: f.sku, qty: f.qty, end: end})
		}
	}
	r.unresolved = r.unresolved || !s.settled
}
