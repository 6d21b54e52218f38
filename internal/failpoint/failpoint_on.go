//go:build shardstock_failpoints

package failpoint

import (
	"os"
	"strings"
	"time"
)

// Pause sleeps at the point name when SHARDSTOCK_FAILPOINT is
// "name=duration".
func Pause(name string) {
	at, pause, ok := strings.Cut(os.Getenv("SHARDSTOCK_FAILPOINT"), "=")
	if !ok || at != name {
		return
	}
	if d, err := time.ParseDuration(pause); err == nil && d > 0 {
		os.Stdout.WriteString("failpoint: " + name + "\n")
		time.Sleep(d)
	}
}

// Stop stops the process at the point name when SHARDSTOCK_FAILPOINT is
// "name=stop" (stopSelf: the caller runs no further).
func Stop(name string) {
	if os.Getenv("SHARDSTOCK_FAILPOINT") != name+"=stop" {
		return
	}
	os.Stdout.WriteString("failpoint: " + name + "\n")
	stopSelf()
}
