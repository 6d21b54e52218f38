// Package faultproxy is a TCP proxy for fault tests: it forwards bytes
// between clients and one target, and on request cuts a connection at a
// chosen point of its traffic, before or after the target saw a given
// message, so that a test can lose a request or only its answer; delays
// the target's answers (a slow target); or holds them all while requests
// still flow (a one-way partition: the target acts, the client hears
// nothing until it heals).
package faultproxy

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// readBufLen is the size of one read; a pattern split across two reads is
// not seen (the cut waits for a later message).
const readBufLen = 64 << 10

// Cut says where an armed cut lands, relative to the first client message
// that holds the pattern.
type Cut uint8

const (
	// CutRequest drops the message and closes both sides: the target
	// never sees it.
	CutRequest Cut = iota + 1
	// CutReply forwards the message, then drops the target's next answer
	// and closes both sides: the target acted, the client never hears.
	CutReply
	// CutDelivered forwards the message and closes both sides at once:
	// the target has it and may still be deciding it when the client
	// learns its call failed.
	CutDelivered
)

// Proxy listens on 127.0.0.1 and forwards every connection to its target.
type Proxy struct {
	lis    net.Listener
	target string

	mu      sync.Mutex
	armed   Cut
	pattern []byte
	conns   map[*link]bool
	closed  bool
	delay   time.Duration
	held    chan struct{} // non-nil while partitioned: closed by Heal

	cuts atomic.Int64
	wg   sync.WaitGroup
}

// Start listens on a free port of 127.0.0.1 and forwards to target.
func Start(target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{lis: lis, target: target, conns: map[*link]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Commit is what a Postgres client sends to commit, as the proxy sees it
// through a URL of StartPostgres: a Parse message of the unnamed statement.
var Commit = []byte("\x00COMMIT\x00")

// StartPostgres starts a proxy to the Postgres server of dbURL and returns
// it with the URL that goes through it. That URL's connections send every
// statement's text (default_query_exec_mode=exec, no cached statements),
// so that a cut armed on Commit fires at each COMMIT.
func StartPostgres(dbURL string) (*Proxy, string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, "", err
	}
	p, err := Start(u.Host)
	if err != nil {
		return nil, "", err
	}
	pu := *u
	pu.Host = p.Addr()
	q := pu.Query()
	q.Set("default_query_exec_mode", "exec")
	pu.RawQuery = q.Encode()
	return p, pu.String(), nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Arm makes the next client message holding pattern, on any connection,
// trigger cut. It replaces a cut armed before and not yet fired.
func (p *Proxy) Arm(pattern []byte, cut Cut) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.pattern = cut, bytes.Clone(pattern)
}

// Disarm drops a cut armed and not yet fired.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.pattern = 0, nil
}

// Armed reports whether a cut waits to fire.
func (p *Proxy) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.armed != 0
}

// SetDelay delays each of the target's answers by d from now on (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Partition holds the target's answers on every connection until Heal,
// while the clients' requests still reach it.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Heal ends a partition: the held answers go on, late, as TCP delivers
// them once a partition shorter than its retransmission timeout heals (a
// client that gave up on the connection has closed it by then).
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// slowdown returns the delay and the partition to apply to an answer.
func (p *Proxy) slowdown() (time.Duration, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay, p.held
}

// Cuts returns how many cuts have fired.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Close stops listening, closes every connection and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for l := range p.conns {
		l.close()
	}
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
	p.mu.Unlock()
	err := p.lis.Close()
	p.wg.Wait()
	return err
}

// fire returns the cut to apply to a client message, disarming it.
func (p *Proxy) fire(msg []byte) Cut {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == 0 || !bytes.Contains(msg, p.pattern) {
		return 0
	}
	cut := p.armed
	p.armed = 0
	p.cuts.Add(1)
	return cut
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, target: t, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.conns[l] = true
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.forward(l) }()
		go func() { defer p.wg.Done(); p.answer(l) }()
	}
}

// link is one proxied connection.
type link struct {
	client, target net.Conn
	dropReply      atomic.Bool
	done           chan struct{} // closed with the link
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() { l.client.Close(); l.target.Close(); close(l.done) })
}

func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// forward copies client to target, applying a cut that fires.
func (p *Proxy) forward(l *link) {
	defer p.forget(l)
	buf := make([]byte, readBufLen)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			cut := p.fire(buf[:n])
			switch cut {
			case CutRequest:
				return
			case CutReply:
				l.dropReply.Store(true)
			}
			if _, werr := l.target.Write(buf[:n]); werr != nil || cut == CutDelivered {
				return // CutDelivered: the message is on its way, then the close
			}
		}
		if err != nil {
			return // EOF or a closed side: close both
		}
	}
}

// answer copies target to client, unless a cut drops the answer; it holds
// answers while the proxy is partitioned and delays them as it is set to.
func (p *Proxy) answer(l *link) {
	defer p.forget(l)
	buf := make([]byte, readBufLen)
	for {
		n, err := l.target.Read(buf)
		if n > 0 {
			if l.dropReply.Load() {
				return
			}
			delay, held := p.slowdown()
			if held != nil {
				select {
				case <-held:
				case <-l.done:
					return
				}
			}
			if delay > 0 {
				select {
				case <-time.After(delay):
				case <-l.done:
					return
				}
			}
			if _, werr := l.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
