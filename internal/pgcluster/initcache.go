package pgcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
)

// initdbRuns counts the initdb runs of this process (a test reads it).
var initdbRuns atomic.Int64

// initCacheDirEnv names a directory for the copies of initdb's output;
// unset means the system's temporary directory.
const initCacheDirEnv = "SHARDSTOCK_PGCLUSTER_CACHE"

// initDBCached fills dataDir as initdb would: from a copy of an earlier
// initdb's output, made by the same binaries with the same arguments,
// else by running initdb and then keeping a copy of what it wrote. With
// the copy a throwaway cluster's start and stop takes less than half the
// CPU (docs/bench-log/2026-12-06-testcpu.md), and make test starts about
// 30 clusters. The copy is of a cluster that was never started, so each
// cluster starts as from its own initdb (with the same system identifier).
func initDBCached(ctx context.Context, binDir, dataDir string, args []string, cred *syscall.Credential) error {
	cache, err := initCacheDir(binDir, args, cred)
	_, errData := os.Lstat(dataDir)
	if err == nil && os.IsNotExist(errData) && ownDirOnly(filepath.Dir(cache)) && isFile(filepath.Join(cache, "PG_VERSION")) {
		want, errSum := os.ReadFile(cache + ".sum")
		got, err := copyTree(cache, dataDir, cred)
		if err == nil && errSum == nil && got == string(want) {
			return nil
		}
		os.RemoveAll(dataDir) // ours, partly copied: initdb needs it empty or absent
		if err == nil {
			os.RemoveAll(cache) // files gone (a /tmp cleaner) or added: the next keeps a new copy
		}
	}
	if err := runInitDB(ctx, binDir, dataDir, args, cred); err != nil {
		return err
	}
	if cache != "" {
		keepCopy(dataDir, cache)
	}
	return nil
}

// initCacheDir returns where initdb's output for these binaries, arguments
// and server user is kept: the key changes with any of them, and with
// either binary's size or modification time (an upgrade).
func initCacheDir(binDir string, args []string, cred *syscall.Credential) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", binDir, strings.Join(args, "\x00"))
	if cred != nil {
		fmt.Fprintf(h, "uid %d gid %d\n", cred.Uid, cred.Gid)
	}
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(binDir, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d %d\n", name, fi.Size(), fi.ModTime().UnixNano())
	}
	root := os.Getenv(initCacheDirEnv)
	if root == "" {
		root = filepath.Join(os.TempDir(), fmt.Sprintf("pgcluster-initdb-%d", os.Getuid()))
	}
	return filepath.Join(root, hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// keepCopy copies dataDir to cache, best effort: into a directory of its
// own first, renamed into place, so that a reader never sees half a copy
// and, of two processes at once, one copy wins.
func keepCopy(dataDir, cache string) {
	if err := os.MkdirAll(filepath.Dir(cache), 0o700); err != nil {
		return
	}
	if !ownDirOnly(filepath.Dir(cache)) {
		return
	}
	tmp, err := os.MkdirTemp(filepath.Dir(cache), "new-")
	if err != nil {
		return
	}
	defer os.RemoveAll(tmp)
	data := filepath.Join(tmp, "data")
	sum, err := copyTree(dataDir, data, nil)
	if err != nil {
		return
	}
	// The list of files and sizes first (the same for every initdb of
	// this key), then the files: a reader checks its copy against it.
	if os.WriteFile(filepath.Join(tmp, "sum"), []byte(sum), 0o600) != nil || os.Rename(filepath.Join(tmp, "sum"), cache+".sum") != nil {
		return
	}
	os.Rename(data, cache) // fails if another process's copy is there: keep that one
}

// copyTree copies the directory src to dst (which must not exist) with
// each file's and directory's permission bits, owned by cred's user if
// cred is set, and returns a digest of the paths and sizes it copied.
func copyTree(src, dst string, cred *syscall.Credential) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		size := fi.Size()
		if d.IsDir() {
			size = 0 // a directory's size is its entries' history, not theirs
		}
		fmt.Fprintf(h, "%s %d %t\n", rel, size, d.IsDir())
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, fi.Mode().Perm()); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(path, target, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("pgcluster: %s: not a file or directory", path)
		}
		if err := os.Chmod(target, fi.Mode().Perm()); err != nil { // not the umask's
			return err
		}
		if cred != nil {
			return os.Lchown(target, int(cred.Uid), int(cred.Gid))
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// copyFile copies src to a new file dst of mode perm.
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil { // copy_file_range(2) on Linux
		out.Close()
		return err
	}
	return out.Close()
}

// ownDirOnly reports whether dir is a directory (not a link to one) that
// this process's user owns and no one else may write: a copy that
// another user could have placed or changed is not used.
func ownDirOnly(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}
