package proccpu

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and a parenthesis, as the kernel writes it.
	st, err := parseStat("4242 (my (odd) cmd) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 30 7 3 20 0 1 0 1 1 1")
	if err != nil || st.ppid != 17 || st.utime != 250 || st.stime != 30 || st.cutime != 7 || st.cstime != 3 || st.start != 1 {
		t.Errorf("parseStat = %+v, %v; want ppid 17, times 250 30 7 3, start 1", st, err)
	}
	if _, err := parseStat("4242 (cmd) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 30 7 3 20 0"); err == nil {
		t.Errorf("parseStat of a stat without its start time = nil error")
	}
	if _, err := parseStat("4242 no parens"); err == nil {
		t.Errorf("parseStat without a command name = nil error")
	}
}

// A child that burns CPU is counted in its parent's tree, while it runs and
// after it has exited and been reaped.
func TestTree_CountsChildren(t *testing.T) {
	before, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	burn := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := burn.Run(); err != nil {
		t.Fatal(err)
	}
	after, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 50*time.Millisecond {
		t.Errorf("tree CPU grew %s across a child that burnt CPU, want at least 50ms", after-before)
	}
	if self := Self(); self <= 0 {
		t.Errorf("Self() = %s", self)
	}
}

// A marked process that ends is gone; one that runs is not. (The load
// generator then reports the server's CPU as not measured: a crash-
// restarted Postgres once showed as -431 µs a request.)
func TestMarks_Gone(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	m, err := Mark(os.Getpid(), sleep.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if pid, gone := m.Gone(); gone {
		t.Fatalf("Gone() = %d with both processes running", pid)
	}
	// The same pid with another start time is another process (a pid the
	// kernel gave again).
	reused := Marks{sleep.Process.Pid: m[sleep.Process.Pid] + 1}
	if pid, gone := reused.Gone(); !gone || pid != sleep.Process.Pid {
		t.Fatalf("Gone() = %d, %v for a pid now naming another process", pid, gone)
	}
	sleep.Process.Kill()
	sleep.Wait()
	if pid, gone := m.Gone(); !gone || pid != sleep.Process.Pid {
		t.Fatalf("Gone() = %d, %v after process %d ended", pid, gone, sleep.Process.Pid)
	}
	if _, err := Mark(sleep.Process.Pid); err == nil {
		t.Fatalf("Mark of an ended process = nil error")
	}
}
