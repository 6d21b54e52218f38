package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// Key layout. Both families live under one root so that operators find
// them together; each is read and watched by its own prefix.
const (
	serversPrefix    = "/shardstock/servers/"
	partitionsPrefix = "/shardstock/partitions/"
)

// serverKey is where server id registers, bound to its lease. The value is
// the JSON of Server.
func serverKey(id string) string { return serversPrefix + id }

// partitionKey is partition p's ownership key. The value is the owner's
// server id; the key's CreateRevision is the epoch.
func partitionKey(p int32) string { return fmt.Sprintf("%s%03d", partitionsPrefix, p) }

// parseServerKey returns the server id in key.
func parseServerKey(key string) (string, bool) {
	id, ok := strings.CutPrefix(key, serversPrefix)
	return id, ok && validServerID(id) == nil
}

// parsePartitionKey returns the partition in key if it is below partitions.
func parsePartitionKey(key string, partitions int) (int32, bool) {
	s, ok := strings.CutPrefix(key, partitionsPrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.ParseInt(s, 10, 32)
	if err != nil || p < 0 || p >= int64(partitions) || partitionKey(int32(p)) != key {
		return 0, false
	}
	return int32(p), true
}

// validServerID reports why id cannot name a server, if it cannot.
func validServerID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty server id", ErrInvalidConfig)
	case len(id) > serverIDLenMax:
		return fmt.Errorf("%w: server id longer than %d bytes", ErrInvalidConfig, serverIDLenMax)
	case strings.ContainsAny(id, "/ \t\r\n"):
		return fmt.Errorf("%w: server id %q contains '/' or white space", ErrInvalidConfig, id)
	}
	return nil
}
