package pgcluster

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStart_CopiesInitdb checks that only the first cluster runs initdb:
// the next starts from a copy of its output, and serves as a cluster of
// its own.
func TestStart_CopiesInitdb(t *testing.T) {
	cache := t.TempDir()
	t.Setenv(initCacheDirEnv, cache) // not parallel: initdbRuns counts this process's runs
	before := initdbRuns.Load()

	a := startCluster(t, "")
	if got := initdbRuns.Load() - before; got != 1 {
		t.Fatalf("initdb runs for the first cluster = %d, want 1", got)
	}
	copies, err := filepath.Glob(filepath.Join(cache, "*", "PG_VERSION"))
	if err != nil || len(copies) != 1 {
		t.Fatalf("copies of initdb's output in %s = %v (%v), want 1", cache, copies, err)
	}

	b := startCluster(t, "")
	if got := initdbRuns.Load() - before; got != 1 {
		t.Fatalf("initdb runs after a second cluster = %d, want 1 (the second copies the first's)", got)
	}
	fi, err := os.Stat(filepath.Join(b.dir, "data"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("Stat(second cluster's data) = %v, %v, want mode 0700", fi, err)
	}
	// The copy is a cluster of its own: it takes writes, which the first
	// does not see.
	cb := connect(t, b.URL())
	execSQL(t, cb, "CREATE TABLE copied (n int)")
	execSQL(t, cb, "INSERT INTO copied VALUES (7)")
	var n int
	scanOne(t, cb, &n, "SELECT n FROM copied")
	if n != 7 {
		t.Fatalf("SELECT n on the second cluster = %d, want 7", n)
	}
	var tables int
	scanOne(t, connect(t, a.URL()), &tables, "SELECT count(*) FROM pg_tables WHERE tablename = 'copied'")
	if tables != 0 {
		t.Fatalf("table copied on the first cluster: %d, want 0", tables)
	}

	// A copy that lost a file (a /tmp cleaner) is not used: initdb runs
	// again, and its output is kept instead.
	if err := os.Remove(filepath.Join(filepath.Dir(copies[0]), "global", "pg_control")); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, "")
	if got := initdbRuns.Load() - before; got != 2 {
		t.Fatalf("initdb runs after a third cluster, the copy short of a file = %d, want 2", got)
	}
	scanOne(t, connect(t, c.URL()), &n, "SELECT 1")
	if !isFile(filepath.Join(filepath.Dir(copies[0]), "global", "pg_control")) {
		t.Fatalf("the copy short of a file was not replaced")
	}
}

// TestStart_CopiesInitdbOnlyFromOwnDir checks that initdb's output is
// neither kept nor copied in a directory others may write.
func TestStart_CopiesInitdbOnlyFromOwnDir(t *testing.T) {
	cache := t.TempDir()
	if err := os.Chmod(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Setenv(initCacheDirEnv, cache) // not parallel: initdbRuns counts this process's runs
	before := initdbRuns.Load()
	startCluster(t, "")
	startCluster(t, "")
	if got := initdbRuns.Load() - before; got != 2 {
		t.Fatalf("initdb runs for two clusters with a cache others may write = %d, want 2", got)
	}
	if copies, _ := filepath.Glob(filepath.Join(cache, "*", "PG_VERSION")); len(copies) != 0 {
		t.Fatalf("copies kept in a directory others may write: %v, want none", copies)
	}
}
