package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo starts a target that answers each line with the same line.
func echo(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return lis.Addr().String()
}

// roundTrip sends a line through conn and waits at most wait for its echo.
func roundTrip(t *testing.T, conn net.Conn, r *bufio.Reader, wait time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(start.Add(wait))
	if _, err := r.ReadString('\n'); err != nil {
		return time.Since(start), false
	}
	return time.Since(start), true
}

func TestProxy_DelayAndPartition(t *testing.T) {
	p, err := Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if _, ok := roundTrip(t, conn, r, 5*time.Second); !ok {
		t.Fatal("no answer through a healthy proxy")
	}

	p.SetDelay(200 * time.Millisecond)
	if took, ok := roundTrip(t, conn, r, 5*time.Second); !ok || took < 200*time.Millisecond {
		t.Errorf("delayed answer took %s (answered %v), want at least 200ms", took, ok)
	}
	p.SetDelay(0)

	p.Partition()
	if _, ok := roundTrip(t, conn, r, 300*time.Millisecond); ok {
		t.Fatal("an answer crossed a partition")
	}
	p.Heal()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("the held answer was not delivered after Heal: %v", err)
	}
	if _, ok := roundTrip(t, conn, r, 5*time.Second); !ok {
		t.Error("no answer after Heal")
	}
}
