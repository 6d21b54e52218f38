package startup

import "go.uber.org/zap"

// nopLogger keeps the etcd client quiet: shardstock logs what matters.
func nopLogger() *zap.Logger { return zap.NewNop() }
