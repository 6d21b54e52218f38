// Package freeport picks a TCP port on 127.0.0.1 for a listener another
// process (or a later call) will open: the dev stack's children, the load
// generator's stack, private Postgres clusters, the tests' commands.
//
// A port that the kernel picks for a listen on port 0 comes from the
// ephemeral range, the same range outgoing connections take their local
// ports from; under load (a load generator's connections, a pool's), one
// of them can take the port between the pick and the bind ("address
// already in use"). Port picks a port below that range instead, where
// only another listener can collide with it.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// low is the lowest port picked: above the well-known and most
// registered services' ports.
const low = 10000

// tries bounds the ports tried before giving up on the range below the
// ephemeral one and asking the kernel.
const tries = 64

// rangeFile holds the kernel's ephemeral range, "first last".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Port returns a port of 127.0.0.1 that nothing listened on a moment ago,
// below the kernel's ephemeral range when there is room there, else the
// kernel's own pick.
func Port() (int, error) {
	if first := ephemeralFirst(); first-low > tries {
		for range tries {
			p := low + rand.IntN(first-low)
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				continue // taken
			}
			l.Close()
			return p, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr is Port as "127.0.0.1:port".
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// ephemeralFirst returns the first port of the kernel's ephemeral range,
// or 0 where it cannot be read (then Port asks the kernel).
func ephemeralFirst() int {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return n
}
