package pgcrash

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/freeport"
	"github.com/shardstock/shardstock/internal/pgcluster"
)

// TestLoop crash-restarts a throwaway cluster twice and checks that each
// crash landed (a new postmaster each time) and that Postgres answered again
// on the same port.
func TestLoop(t *testing.T) {
	dataDir, url := startCluster(t)
	pid0 := postmasterPID(t, dataDir)
	var log bytes.Buffer
	l, err := Start(context.Background(), Config{DataDir: dataDir, URL: url, Every: time.Second, Count: 2, Log: &log})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	select {
	case <-l.Finished():
	case <-time.After(2 * time.Minute):
		t.Fatal("the loop did not finish in 2 minutes")
	}
	res := l.Stop()
	if res.Done() != 2 || len(res.Crashes) != 2 {
		t.Fatalf("Stop() = %+v, want 2 crash-restarts done\n%s", res, log.String())
	}
	for i, c := range res.Crashes {
		if c.Err != nil || c.Down <= 0 || c.Stopped <= 0 || c.Down < c.Stopped {
			t.Errorf("crash %d = %+v, want a stop and a later answer", i, c)
		}
	}
	if got := strings.Count(log.String(), "Postgres answered again"); got != 2 {
		t.Errorf("log has %d crash lines, want 2:\n%s", got, log.String())
	}
	if pid := postmasterPID(t, dataDir); pid == pid0 {
		t.Errorf("postmaster pid %s unchanged: the cluster was not restarted", pid)
	}
	if err := waitAnswer(context.Background(), url); err != nil {
		t.Errorf("after the loop: %v", err)
	}
}

// TestStart_Refuses checks that the loop never crashes the shared server, or
// a cluster other than the one the URL names.
func TestStart_Refuses(t *testing.T) {
	dir := t.TempDir()
	pid := func(port int) {
		t.Helper()
		body := "12345\n" + dir + "\n1700000000\n" + strconv.Itoa(port) + "\n/tmp\n127.0.0.1\n"
		if err := os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, url string
		port      int
		want      string
	}{
		{"SharedPort", "postgres://postgres@127.0.0.1:5432/postgres", 5432, "the shared server"},
		{"OtherPort", "postgres://postgres@127.0.0.1:40001/postgres", 40000, "not the cluster under test"},
		{"RemoteHost", "postgres://postgres@db.example:40000/postgres", 40000, "only a cluster on this machine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid(tc.port)
			_, err := Start(context.Background(), Config{DataDir: dir, URL: tc.url, Every: time.Second, Count: 1})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start(port %d, %s) = %v, want an error saying %q", tc.port, tc.url, err, tc.want)
			}
		})
	}
	if _, err := Start(context.Background(), Config{DataDir: dir, URL: "x", Every: time.Second, Count: CountMax + 1}); err == nil {
		t.Errorf("Start(count %d) = nil, want an error", CountMax+1)
	}
	if _, err := Start(context.Background(), Config{DataDir: dir, URL: "x", Every: time.Millisecond, Count: 1}); err == nil {
		t.Errorf("Start(every 1ms) = nil, want an error")
	}
}

// startCluster initialises and starts a durable throwaway cluster with
// pg_ctl, as scripts/bench/postgres.sh does, and stops it at the end.
func startCluster(t *testing.T) (dataDir, url string) {
	t.Helper()
	bin := ""
	if ds, _ := filepath.Glob(filepath.Join(pgLibDir, "*", "bin")); len(ds) > 0 {
		bin = ds[len(ds)-1]
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Skipf("no Postgres server binaries under %s", pgLibDir)
	}
	cred, err := pgcluster.ServerCredential()
	if err != nil {
		t.Skip(err)
	}
	// The postgres OS user must reach the directory: not t.TempDir (0700).
	dir, err := os.MkdirTemp("", "pgcrash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	dataDir = filepath.Join(dir, "data")
	runAs := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	runAs("initdb", "-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	runAs("pg_ctl", "-D", dataDir, "-l", filepath.Join(dir, "postgres.log"), "-w", "-t", "60",
		"-o", "-p "+strconv.Itoa(port)+" -k "+dir+" -c listen_addresses=127.0.0.1", "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", dataDir, "-m", "immediate", "-w", "stop")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		_ = cmd.Run()
	})
	return dataDir, "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"
}

func postmasterPID(t *testing.T, dataDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.SplitN(string(b), "\n", 2)[0]
}
