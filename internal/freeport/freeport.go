// Package freeport picks a TCP port on 127.0.0.1 for a listener another
// process (or a later call) will open: the dev stack's children, the load
// generator's stack, private Postgres clusters, the tests' commands.
//
// A port that the kernel picks for a listen on port 0 comes from the
// ephemeral range, the same range outgoing connections take their local
// ports from; under load (a load generator's connections, a pool's), one
// of them can take the port between the pick and the bind ("address
// already in use"). Port picks a port outside that range instead, where
// only another listener can collide with it, and never the same port
// twice in one process.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

const (
	// low is the lowest port picked: above the well-known and most
	// registered services' ports.
	low = 10000
	// high is the highest port there is.
	high = 65535
	// tries bounds the ports tried outside the ephemeral range before
	// asking the kernel.
	tries = 64
	// rangeFile holds the kernel's ephemeral range, "first last".
	rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"
)

var (
	mu    sync.Mutex
	given = map[int]bool{} // ports this process was given
)

// Port returns a port of 127.0.0.1 that nothing listened on a moment ago
// and that this process was not given before: outside the kernel's
// ephemeral range when there is room (below it, else above it), else the
// kernel's own pick.
func Port() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	lo, hi := outside()
	for i := 0; i < tries && hi > lo; i++ {
		p := lo + rand.IntN(hi-lo)
		if given[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("pick a port: %w", err)
		}
		l.Close()
		given[p] = true
		return p, nil
	}
	for range tries {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("pick a port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given[p] {
			given[p] = true
			return p, nil
		}
	}
	return 0, errors.New("pick a port: the kernel gave only ports already given")
}

// Addr is Port as "127.0.0.1:port".
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// outside returns the ports [lo, hi) to pick from: the larger of the room
// below the ephemeral range (from low) and above it, or an empty range
// where the kernel's range cannot be read or leaves too little room.
func outside() (lo, hi int) {
	first, last, ok := ephemeral()
	if !ok {
		return 0, 0
	}
	return outsideOf(first, last)
}

// outsideOf is outside for the ephemeral range [first, last].
func outsideOf(first, last int) (lo, hi int) {
	below, above := first-low, high-last
	switch {
	case below >= above && below > tries:
		return low, first
	case above > tries:
		return last + 1, high + 1
	}
	return 0, 0
}

// ephemeral returns the kernel's ephemeral port range.
func ephemeral() (first, last int, ok bool) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || first > last {
		return 0, 0, false
	}
	return first, last, true
}
