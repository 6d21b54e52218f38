package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/pgcluster"
	"github.com/shardstock/shardstock/internal/readiness"
)

// Bounds and settings of the namespace network.
const (
	netCmdTimeout     = 10 * time.Second // one ip, iptables or tc command
	netSubnetTriesMax = 20               // random /24s tried before giving up on a free one
	netPrefixLen      = 24
	netNamePrefix     = "ssnf" // of every namespace and root-side link a run makes: easy to find if a run is killed
	netHostOctetMin   = 10     // hosts are .10 up; .1 is the test process's own
)

// netLab is a network of the test's own, made and deleted by it: each
// host a network namespace with one veth to a bridge in a hub namespace
// of its own, and the test process (the clients) on one more veth to it
// from the root namespace. The bridge lives in a namespace, not the root,
// so that the root's firewall (Docker's FORWARD DROP, br_netfilter) never
// sees the hosts' packets. Every name carries the run's id; t.Cleanup
// deletes them all, also when the test fails.
type netLab struct {
	t      *testing.T
	id     string
	subnet string // "10.a.b."
	hub    string // the bridge's namespace
	hosts  map[string]netHost
}

// netHost is one host of a netLab.
type netHost struct {
	ns   string // its network namespace
	addr string // its IPv4 address
}

// newNetLab makes a netLab with a host for each of names, or skips the
// test where namespaces cannot be made: not root, ip, iptables, tc or
// setpriv missing, or `ip netns add` refused.
func newNetLab(t *testing.T, names ...string) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root (ip netns add, iptables): skipped")
	}
	for _, tool := range []string{"ip", "iptables", "tc", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (apt-get install iproute2 iptables util-linux): network namespaces skipped", tool)
		}
	}
	lab := &netLab{t: t, id: fmt.Sprintf("%06x", rand.Uint32()&0xffffff), hosts: map[string]netHost{}}
	lab.hub = lab.nsName("hub")
	if err := lab.run("", "ip", "netns", "add", lab.hub); err != nil {
		t.Skipf("network namespaces cannot be made here: %v", err)
	}
	t.Cleanup(func() { lab.run("", "ip", "netns", "del", lab.hub) })
	lab.subnet = lab.freeSubnet()
	lab.must(lab.hub, "ip", "link", "set", "lo", "up")
	lab.must(lab.hub, "ip", "link", "add", "br0", "type", "bridge")
	lab.must(lab.hub, "ip", "link", "set", "br0", "up")

	// The test process's own veth: deleting the hub deletes its peer,
	// and so it; the cleanup is for a run that fails before that.
	root := netNamePrefix + lab.id
	lab.must("", "ip", "link", "add", root, "type", "veth", "peer", "name", "v-root", "netns", lab.hub)
	t.Cleanup(func() { lab.run("", "ip", "link", "del", root) })
	lab.must(lab.hub, "ip", "link", "set", "v-root", "master", "br0", "up")
	lab.must("", "ip", "addr", "add", lab.subnet+"1/"+strconv.Itoa(netPrefixLen), "dev", root)
	lab.must("", "ip", "link", "set", root, "up")

	for i, name := range names {
		h := netHost{ns: lab.nsName(name), addr: lab.subnet + strconv.Itoa(netHostOctetMin+i)}
		lab.must("", "ip", "netns", "add", h.ns)
		t.Cleanup(func() { lab.run("", "ip", "netns", "del", h.ns) })
		lab.must(lab.hub, "ip", "link", "add", "v-"+name, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
		lab.must(lab.hub, "ip", "link", "set", "v-"+name, "master", "br0", "up")
		lab.must(h.ns, "ip", "link", "set", "lo", "up")
		lab.must(h.ns, "ip", "addr", "add", h.addr+"/"+strconv.Itoa(netPrefixLen), "dev", "eth0")
		lab.must(h.ns, "ip", "link", "set", "eth0", "up")
		lab.hosts[name] = h
	}
	// Debian's iptables is the nf_tables one: check that it works inside
	// a namespace before the faults depend on it.
	if err := lab.run(lab.hosts[names[0]].ns, "iptables", "-w", "-L", "-n"); err != nil {
		t.Fatalf("iptables inside a network namespace: %v", err)
	}
	return lab
}

// nsName is the namespace name of host name in this run.
func (l *netLab) nsName(name string) string {
	return netNamePrefix + "-" + l.id + "-" + name
}

// ns returns host name's namespace, addr its address.
func (l *netLab) ns(name string) string   { return l.hosts[name].ns }
func (l *netLab) addr(name string) string { return l.hosts[name].addr }

// freeSubnet picks a random 10.x.y.0/24 that no address or route of the
// root namespace falls in.
func (l *netLab) freeSubnet() string {
	l.t.Helper()
	var taken strings.Builder
	for _, args := range [][]string{{"-4", "-o", "addr", "show"}, {"-4", "route", "show", "table", "all"}} {
		out, err := l.output("", "ip", args...)
		if err != nil {
			l.t.Fatal(err)
		}
		taken.WriteString(out)
	}
	for range netSubnetTriesMax {
		s := fmt.Sprintf("10.%d.%d.", 200+rand.IntN(50), rand.IntN(256))
		if !strings.Contains(taken.String(), s) {
			return s
		}
	}
	l.t.Fatalf("no free 10.x.y.0/24 in %d tries", netSubnetTriesMax)
	return ""
}

// output runs name with args inside namespace ns ("": the root one) and
// returns its output.
func (l *netLab) output(ns, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), netCmdTimeout)
	defer cancel()
	if ns != "" {
		args = append([]string{"netns", "exec", ns, name}, args...)
		name = "ip"
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (l *netLab) run(ns, name string, args ...string) error {
	_, err := l.output(ns, name, args...)
	return err
}

// must is run, failing the test on an error. It may be called from any
// goroutine (it does not stop the test).
func (l *netLab) must(ns, name string, args ...string) {
	if err := l.run(ns, name, args...); err != nil {
		l.t.Error(err)
	}
}

// dropRule is one iptables rule of a fault: inside host's namespace, DROP
// the packets it sends to peer (chain OUTPUT) or receives from it (INPUT),
// all of them or each with probability p (-m statistic --mode random).
type dropRule struct {
	host, chain, peer string
	p                 float64 // 0: every packet
	comment           string  // names the rule in iptables -L, to read its counter
	dropped           int64   // packets, read when the rule is lifted
}

func (r *dropRule) spec(l *netLab) []string {
	dir := "-d"
	if r.chain == "INPUT" {
		dir = "-s"
	}
	spec := []string{r.chain, dir, l.addr(r.peer), "-m", "comment", "--comment", r.comment}
	if r.p > 0 {
		spec = append(spec, "-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(r.p, 'f', 2, 64))
	}
	return append(spec, "-j", "DROP")
}

// counterLine matches a rule's line of `iptables -L -v -x -n`: its packet
// counter first.
var counterLine = regexp.MustCompile(`^\s*(\d+)\s+\d+\s+DROP\b`)

// counter reads how many packets r has dropped.
func (r *dropRule) counter(l *netLab) (int64, error) {
	out, err := l.output(l.ns(r.host), "iptables", "-w", "-L", r.chain, "-v", "-x", "-n")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		if m := counterLine.FindStringSubmatch(line); m != nil && strings.Contains(line, "/* "+r.comment+" */") {
			return strconv.ParseInt(m[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("rule %s not found in %s's %s chain:\n%s", r.comment, r.host, r.chain, out)
}

// netFault is one fault of the plan: its rules (or a starved link) from at
// to until, in time since the load began.
type netFault struct {
	name      string
	at, until time.Duration
	rules     []*dropRule
	starve    string // a host whose link's egress is held to netStarvedRate (tbf), "" if none
	applied   bool
	lifted    bool
	// landed counts the packets the fault dropped (its rules), or, for a
	// starved link, those tbf held back past the rate (overlimits) or
	// dropped.
	landed int64
	detail string // the figures behind landed
}

// The starved link: tbf lets netStarvedRate through, a burst of
// netStarvedBurst at once, and drops what would wait longer than
// netStarvedLatency.
const (
	netStarvedRate    = "256kbit"
	netStarvedBurst   = "4kb"
	netStarvedLatency = "100ms"
)

// apply puts the fault's rules (or its tbf) in place.
func (f *netFault) apply(l *netLab) {
	for _, r := range f.rules {
		l.must(l.ns(r.host), "iptables", append([]string{"-w", "-A"}, r.spec(l)...)...)
	}
	if f.starve != "" {
		l.must(l.ns(f.starve), "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
			"rate", netStarvedRate, "burst", netStarvedBurst, "latency", netStarvedLatency)
	}
	f.applied = true
}

// tbfCounts matches tc -s's statistics of a qdisc.
var tbfCounts = regexp.MustCompile(`dropped (\d+), overlimits (\d+)`)

// lift reads what the fault did (landed) and removes it.
func (f *netFault) lift(l *netLab) {
	var parts []string
	for _, r := range f.rules {
		n, err := r.counter(l)
		if err != nil {
			l.t.Error(err)
		}
		r.dropped = n
		f.landed += n
		parts = append(parts, fmt.Sprintf("%s %s %s: %d", r.host, r.chain, r.peer, n))
		l.must(l.ns(r.host), "iptables", append([]string{"-w", "-D"}, r.spec(l)...)...)
	}
	if f.starve != "" {
		out, err := l.output(l.ns(f.starve), "tc", "-s", "qdisc", "show", "dev", "eth0")
		if err != nil {
			l.t.Error(err)
		}
		if m := tbfCounts.FindStringSubmatch(out); m != nil {
			dropped, _ := strconv.ParseInt(m[1], 10, 64)
			over, _ := strconv.ParseInt(m[2], 10, 64)
			f.landed = dropped + over
			parts = append(parts, fmt.Sprintf("tbf dropped %d, overlimits %d", dropped, over))
		} else {
			l.t.Errorf("no tbf statistics on %s's link:\n%s", f.starve, out)
		}
		l.must(l.ns(f.starve), "tc", "qdisc", "del", "dev", "eth0", "root")
	}
	f.detail = strings.Join(parts, "; ")
	f.lifted = true
}

// both returns the rules that drop host's packets to and from peer, each
// with probability p (0: all): a lossy link, or a total partition.
func both(host, peer string, p float64, comment string) []*dropRule {
	return []*dropRule{
		{host: host, chain: "OUTPUT", peer: peer, p: p, comment: comment + "-out"},
		{host: host, chain: "INPUT", peer: peer, p: p, comment: comment + "-in"},
	}
}

// oneWay returns the rule that drops what host sends to peer: a one-way
// partition (peer's packets still reach host).
func oneWay(host, peer, comment string) []*dropRule {
	return []*dropRule{{host: host, chain: "OUTPUT", peer: peer, comment: comment}}
}

// runPlan applies each fault at its time and lifts it at its end, or all
// of them once ctx ends; it returns when the last fault was applied, in
// ns since the load began (since's clock), 0 if not all were.
func runPlan(ctx context.Context, l *netLab, plan []*netFault, since func() int64) int64 {
	type event struct {
		at   time.Duration
		f    *netFault
		lift bool
	}
	var events []event
	for _, f := range plan {
		events = append(events, event{f.at, f, false}, event{f.until, f, true})
	}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	defer func() {
		for _, f := range plan {
			if f.applied && !f.lifted {
				f.lift(l)
			}
		}
	}()
	var lastApplied int64
	applied := 0
	for _, e := range events {
		if d := e.at - time.Duration(since()); d > 0 {
			select {
			case <-ctx.Done():
				return 0
			case <-time.After(d):
			}
		}
		if e.lift {
			e.f.lift(l)
			continue
		}
		e.f.apply(l)
		applied++
		lastApplied = since()
	}
	if applied < len(plan) {
		return 0
	}
	return lastApplied
}

// TestE2E_NetnsFaults runs the recorded history (runHistory, checkHistory)
// with every part a host of its own in a network namespace (Postgres,
// etcd, three shard servers, the allocator; the clients are this process,
// on the root namespace's veth), and faults from the kernel between them
// during the load: random packet loss (iptables -m statistic), one-way
// partitions (DROP in one direction only: a shard server's queries reach
// Postgres and its answers are lost; the allocator's requests lost before
// a shard server; a shard server's answers lost after it acted), total
// partitions (a shard server cut from etcd past its lease, so that others
// take its partitions while it can still reach Postgres; the allocator cut
// from etcd while they move; another shard server cut from Postgres), and
// a starved link (tc tbf). Each fault must be seen to
// land: its rules' packet counters, or tbf's, above zero.
func TestE2E_NetnsFaults(t *testing.T) {
	lab := newNetLab(t, "pg", "etcd", "s1", "s2", "s3", "alloc")
	ctx, cancel := context.WithTimeout(context.Background(), linRunTimeout)
	defer cancel()
	pg, err := pgcluster.StartHost(ctx, "", pgcluster.Host{Addr: lab.addr("pg"), Netns: lab.ns("pg")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	etcd := startEtcdProcessIn(t, lab.ns("etcd"), lab.addr("etcd"))
	netns := map[string]string{"allocator": lab.ns("alloc")}
	s := newStackOpts(t, stackOpts{
		dbURL: pg.URL(), etcd: etcd, netns: netns,
		allocArgs: []string{"-addr", lab.addr("alloc") + ":0", "-operator-addr", lab.addr("alloc") + ":0"},
		startShards: func(s *stack) {
			for _, id := range []string{"s1", "s2", "s3"} {
				netns[id] = lab.ns(id)
				s.shards[id] = s.start(id, filepath.Join(bin, "shard"), "-id", id, "-addr", lab.addr(id)+":0",
					"-lease-ttl", s.leaseTTL.String(), "-db-max-conns", "8", "-log-level", "warn")
			}
		},
	})
	const sku = "netns"
	s.createSKU(sku, linStock, 8)

	// Times are since the load began; it lasts about 9 s (linOpsMax keys,
	// linPause apart per client), so every fault lands mid-sale.
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	plan := []*netFault{
		{name: "loss 30%, shard server s1 <-> Postgres", at: ms(300), until: ms(2300), rules: both("s1", "pg", 0.3, "loss-s1-pg")},
		{name: "loss 30%, allocator <-> shard server s2", at: ms(500), until: ms(2500), rules: both("alloc", "s2", 0.3, "loss-alloc-s2")},
		{name: "loss 50%, shard server s2 <-> etcd", at: ms(800), until: ms(2800), rules: both("s2", "etcd", 0.5, "loss-s2-etcd")},
		// Early, while the sale is sure to be on: it lands only where s2
		// sends more than the rate, its answers to the allocator, and once
		// the SKU sells out (6 to 9 s in) the refusals come from memory
		// and s2 sends next to nothing (it failed "never landed" at 6.6 s).
		{name: "starved: s2's link held to " + netStarvedRate + "/s (tbf)", at: ms(900), until: ms(2900), starve: "s2"},
		// 4 s: Postgres acts on s2's batches and its answers wait for the
		// link to heal (TCP resends them, backing off), longer than the
		// allocator's calls and the clients' 3 s deadlines wait.
		{name: "one way: Postgres's answers to s2 dropped for 4 s (its queries arrive)", at: ms(2400), until: ms(6400), rules: oneWay("pg", "s2", "oneway-pg-s2")},
		{name: "one way: the allocator's requests to s3 dropped", at: ms(2800), until: ms(4000), rules: oneWay("alloc", "s3", "oneway-alloc-s3")},
		{name: "one way: s3's answers to the allocator dropped (after it acted)", at: ms(4400), until: ms(5600), rules: oneWay("s3", "alloc", "oneway-s3-alloc")},
		{name: "total: s1 cut from etcd for 3 s, past its 2 s lease", at: ms(4200), until: ms(7200), rules: both("s1", "etcd", 0, "cut-s1-etcd")},
		// While s1's lease runs out and its partitions move: its batches
		// in flight cannot reach Postgres, whose packets still reach it.
		{name: "one way: s1's packets to Postgres dropped as its lease runs out", at: ms(4600), until: ms(6400), rules: oneWay("s1", "pg", "oneway-s1-pg")},
		{name: "total: shard server s3 cut from Postgres", at: ms(5800), until: ms(7000), rules: both("s3", "pg", 0, "cut-s3-pg")},
		// While s1's partitions move: the allocator learns the new owners
		// late, and keeps sending to s1, which no longer owns them.
		{name: "total: the allocator cut from etcd", at: ms(5600), until: ms(7600), rules: both("alloc", "etcd", 0, "cut-alloc-etcd")},
	}
	var lastApplied int64
	h := runHistory(ctx, t, s, sku, func(ctx context.Context, since func() int64) {
		lastApplied = runPlan(ctx, lab, plan, since)
	})
	var summary []string
	for _, f := range plan {
		t.Logf("fault %q: %d landed (%s)", f.name, f.landed, f.detail)
		if !f.applied {
			t.Errorf("fault %q was never applied: the load ended before %s", f.name, f.at)
		} else if f.landed == 0 {
			t.Errorf("fault %q never landed: no packet dropped or held back (%s)", f.name, f.detail)
		}
		summary = append(summary, fmt.Sprintf("%s: %d", f.name, f.landed))
	}
	// Whether the faults reached the commit-outcome path (a COMMIT's
	// answer lost: the connection failed after it was sent): a figure,
	// not a check. TCP resends across every partition here, shorter than
	// the shard servers' 10 s batch deadline, so it has been 0 in every
	// run; the TCP proxy of TestE2E_LinkFaultsUnderLoad cuts connections.
	var lost []string
	for _, outcome := range []string{"committed", "voided", "unknown"} {
		lost = append(lost, fmt.Sprintf("%s %d", outcome, shardCounter(t, s, `shardstock_shard_lost_commits_total{outcome="`+outcome+`"}`)))
	}
	t.Logf("commits whose answer was lost, by their mark: %s", strings.Join(lost, ", "))
	checkHistory(t, s, sku, h, lastApplied, "faults from the kernel ("+strings.Join(summary, "; ")+")")
}

// shardCounter sums one sample of every shard server's /metrics (served on
// its shard port), 0 where it is absent.
func shardCounter(t *testing.T, s *stack, sample string) int64 {
	t.Helper()
	var sum int64
	for id, p := range s.shards {
		resp, err := http.Get(p.waitReady(t, readiness.RoleShard).Addr + "/metrics")
		if err != nil {
			t.Errorf("GET %s /metrics: %v", id, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(body); m != nil {
			v, _ := strconv.ParseFloat(string(m[1]), 64)
			sum += int64(v)
		}
	}
	return sum
}
