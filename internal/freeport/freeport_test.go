package freeport

import (
	"net"
	"testing"
)

// TestPort: the port is below the ephemeral range (where no outgoing
// connection takes it) and can be listened on.
func TestPort(t *testing.T) {
	first := ephemeralFirst()
	if first == 0 {
		t.Skipf("%s not readable here", rangeFile)
	}
	seen := map[int]bool{}
	for range 20 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if p < low || p >= first {
			t.Fatalf("Port() = %d, want in [%d, %d): below the ephemeral range", p, low, first)
		}
		seen[p] = true
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on Addr() %s: %v", addr, err)
		}
		l.Close()
	}
	if len(seen) < 10 {
		t.Errorf("20 picks gave %d ports, want them spread (concurrent pickers would collide)", len(seen))
	}
}
