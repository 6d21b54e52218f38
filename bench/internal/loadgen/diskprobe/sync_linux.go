package diskprobe

import (
	"os"
	"syscall"
)

// fdatasync is what Postgres's default wal_sync_method does on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
