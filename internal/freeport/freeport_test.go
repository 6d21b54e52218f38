package freeport

import (
	"net"
	"testing"
)

// TestPort: every port is outside the ephemeral range (where no outgoing
// connection takes it), can be listened on, and is never given twice.
func TestPort(t *testing.T) {
	first, last, ok := ephemeral()
	if !ok {
		t.Skipf("%s not readable here", rangeFile)
	}
	seen := map[int]bool{}
	for range 40 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(addr)
		p, err := net.LookupPort("tcp", port)
		if err != nil {
			t.Fatal(err)
		}
		if p >= first && p <= last {
			t.Fatalf("Addr() = %s, in the ephemeral range [%d, %d]", addr, first, last)
		}
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on Addr() %s: %v", addr, err)
		}
		l.Close()
	}
}

// TestOutsideOf: the larger room outside the ephemeral range, or none.
func TestOutsideOf(t *testing.T) {
	for _, tc := range []struct {
		first, last int
		lo, hi      int
	}{
		{32768, 60999, low, 32768},      // Linux's default: below
		{49152, 65535, low, 49152},      // IANA's: below
		{1024, 60999, 61000, high + 1},  // no room below: above
		{20000, 30000, 30001, high + 1}, // room both sides, more above
		{1024, 65535, 0, 0},             // no room anywhere: the kernel's pick
		{low, high - 10, 0, 0},          // too little room either side
	} {
		if lo, hi := outsideOf(tc.first, tc.last); lo != tc.lo || hi != tc.hi {
			t.Errorf("outsideOf(%d, %d) = [%d, %d), want [%d, %d)", tc.first, tc.last, lo, hi, tc.lo, tc.hi)
		}
	}
}

// TestPort_NotGivenTwice: with every port outside the ephemeral range
// given already, Port gives none of them again (it asks the kernel).
func TestPort_NotGivenTwice(t *testing.T) {
	lo, hi := outside()
	if hi <= lo {
		t.Skip("no room outside the ephemeral range here")
	}
	mu.Lock()
	saved := given
	given = map[int]bool{}
	for p := lo; p < hi; p++ {
		given[p] = true
	}
	mu.Unlock()
	t.Cleanup(func() { mu.Lock(); given = saved; mu.Unlock() })
	p, err := Port()
	if err != nil {
		t.Fatal(err)
	}
	if p >= lo && p < hi {
		t.Errorf("Port() = %d, given already", p)
	}
}
