package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/etcdembed"
)

// etcdChildEnv, set in the environment of this package's test binary,
// makes it an etcd process (etcdChild) instead of running tests;
// etcdHostEnv is then the address it listens on ("": 127.0.0.1).
const (
	etcdChildEnv = "SHARDSTOCK_E2E_ETCD_CHILD"
	etcdHostEnv  = "SHARDSTOCK_E2E_ETCD_HOST"
)

// startEtcdProcess starts an embedded etcd in a process of its own (this
// test binary again, as etcdChild) and returns its client URLs; the
// process ends with the test. A test whose own process makes the load
// uses it so that the load starves etcd no more than a real client's
// would: an etcd inside the test process shares its Go scheduler with
// thousands of the load's goroutines, and its keep-alive answers wait
// behind them (on CI, nine seconds: every lease of the stack expired).
func startEtcdProcess(t *testing.T) string {
	t.Helper()
	return startEtcdProcessIn(t, "", "")
}

// startEtcdProcessIn is startEtcdProcess with the process inside network
// namespace netns (ip netns exec; "": ours), listening on addr ("":
// 127.0.0.1), an address of that namespace.
func startEtcdProcessIn(t *testing.T, netns, addr string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	if netns != "" {
		cmd = exec.Command("ip", "netns", "exec", netns, os.Args[0])
	}
	cmd.Env = append(os.Environ(), etcdChildEnv+"=1", etcdHostEnv+"="+addr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("etcd process: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close() // the child's cue to stop
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case s := <-line:
		if s == "" {
			t.Fatal("etcd process printed no endpoints")
		}
		return s
	case <-time.After(startTimeout):
		t.Fatalf("etcd process: no endpoints within %v", startTimeout)
		return ""
	}
}

// etcdChild runs an embedded etcd, prints its client URLs on one line and
// serves until its standard input closes (its parent ended or let go).
func etcdChild() int {
	host := os.Getenv(etcdHostEnv)
	if host == "" {
		host = "127.0.0.1"
	}
	e, err := etcdembed.StartHost(context.Background(), "", host)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd process:", err)
		return 1
	}
	defer e.Close()
	fmt.Println(strings.Join(e.Endpoints(), ","))
	io.Copy(io.Discard, os.Stdin)
	return 0
}
