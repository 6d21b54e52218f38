package e2e

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardstock/shardstock/internal/pgtest"
)

// TestE2E_MakeRun starts `make run` as a user would (a process, real
// ports), waits for its banner, runs the curl example it prints, then sends
// SIGTERM to its process group, as Ctrl-C would, and checks that no process
// is left behind.
//
// It runs twice on one database: a second start, with a new embedded etcd
// whose revisions (the epochs) start again from 1, must own every partition
// again although the database keeps the first run's higher epochs.
func TestE2E_MakeRun(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	db := pgtest.NewDB(t)
	t.Run("First", func(t *testing.T) { makeRun(t, db) })
	// As if the first run's etcd had lived long: epochs far above what a
	// new etcd's revisions reach by retrying claims.
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "UPDATE partitions SET epoch = 1000000000"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	t.Run("Again", func(t *testing.T) { makeRun(t, db) })
}

func makeRun(t *testing.T, db string) {
	addr := freeAddr(t)
	cmd := exec.Command("make", "-C", "../..", "run")
	cmd.Env = append(os.Environ(), "SHARDSTOCK_ADDR="+addr, "SHARDSTOCK_ADMIN_TOKEN="+adminToken, "DATABASE_URL="+db)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = nil // the children's logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL) })

	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var banner []string
	deadline := time.After(4 * time.Minute) // includes compiling
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("make run ended before it was ready; printed:\n%s", strings.Join(banner, "\n"))
			}
			banner = append(banner, l)
			done = strings.HasPrefix(l, "Ctrl-C stops everything")
		case <-deadline:
			t.Fatalf("make run not ready in time; printed:\n%s", strings.Join(banner, "\n"))
		}
	}
	text := strings.Join(banner, "\n")
	if !strings.Contains(text, "http://"+addr) || !strings.Contains(text, adminToken) {
		t.Errorf("banner lacks the URL or the admin token:\n%s", text)
	}
	var ran int
	for _, l := range banner {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "curl ") {
			continue
		}
		got, err := exec.Command("bash", "-c", l).CombinedOutput()
		if err != nil || !regexp.MustCompile(`^\{"(operation|stock)"`).Match(got) {
			t.Errorf("printed example %q = %s, %v", l, got, err)
		}
		ran++
	}
	if ran < 2 {
		t.Errorf("banner printed %d curl examples, want 2:\n%s", ran, text)
	}

	syscall.Kill(-pgid, syscall.SIGTERM)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatalf("make run did not stop within 30 s of SIGTERM")
	}
	// Every process of the group (make, the dev stack, its shard servers,
	// allocator and throwaway Postgres) must be gone.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := syscall.Kill(-pgid, 0)
		if errors.Is(err, syscall.ESRCH) {
			break
		}
		if time.Now().After(deadline) {
			ps, _ := exec.Command("ps", "-o", "pid,pgid,args", "-g", strconv.Itoa(pgid)).CombinedOutput()
			t.Fatalf("processes left behind after SIGTERM:\n%s", ps)
		}
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("something still listens on %s", addr)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
