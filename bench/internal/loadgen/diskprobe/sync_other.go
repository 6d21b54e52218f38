//go:build !linux

package diskprobe

import "os"

// fdatasync falls back to fsync where the system has no fdatasync.
func fdatasync(f *os.File) error { return f.Sync() }
