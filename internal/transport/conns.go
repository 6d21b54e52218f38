package transport

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// ConnMetrics are what LimitConns reports.
type ConnMetrics struct {
	Open    prometheus.Gauge   // connections held
	Refused prometheus.Counter // connections closed at once, over the bound
}

// NewConnMetrics registers a listener's connection metrics with reg under
// the given name prefix: <prefix>_conns and <prefix>_conns_refused_total.
func NewConnMetrics(reg prometheus.Registerer, prefix string) ConnMetrics {
	m := ConnMetrics{
		Open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "_conns", Help: "Client connections open on the public listener.",
		}),
		Refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "_conns_refused_total", Help: "Client connections closed as soon as accepted: the listener held its bound (-max-client-conns).",
		}),
	}
	reg.MustRegister(m.Open, m.Refused)
	return m
}

// LimitConns returns a listener that holds at most max connections at
// once. A connection accepted beyond that is reset at once: its client
// learns it in one round trip and may retry or go to another server, and a
// storm of connections costs an accept and a close each, not the memory
// and goroutines of a served HTTP/2 connection; the listen queue keeps
// draining, so it never overflows into SYN retransmits for everyone.
// (golang.org/x/net/netutil.LimitListener bounds the same count by not
// accepting, which leaves the storm in the listen queue.) max <= 0: no
// bound, lis as it is.
func LimitConns(lis net.Listener, max int, m ConnMetrics) net.Listener {
	if max <= 0 {
		return lis
	}
	return &limitListener{Listener: lis, max: int64(max), m: m}
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
	m    ConnMetrics
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.m.Refused.Inc()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset: no FIN handshake, no TIME_WAIT here
			}
			_ = c.Close()
			continue
		}
		l.m.Open.Inc()
		return &limitConn{Conn: c, l: l}, nil
	}
}

// limitConn gives its place back once, on its first Close.
type limitConn struct {
	net.Conn
	once sync.Once
	l    *limitListener
}

// CloseWrite half-closes a TCP connection: net/http does that before it
// closes an HTTP/1.1 connection, so that the client reads the whole
// response before the reset (the wrapper would otherwise hide it).
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.m.Open.Dec()
	})
	return err
}
