package stockctlcmd_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/cmd/stockctlcmd"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
)

// follow runs a stockctl command that streams until want appears in its
// output, then interrupts it, and returns its exit code and output.
func follow(t *testing.T, env map[string]string, want string, args ...string) (int, string) {
	t.Helper()
	var o, e cmdtest.Output
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- stockctlcmd.Run(ctx, args, func(k string) string { return env[k] }, &o, &e) }()
	for !strings.Contains(o.String(), want) {
		select {
		case code := <-done:
			t.Fatalf("stockctl %v: exit %d before printing %q\n%s%s", args, code, want, o.String(), e.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	return <-done, o.String()
}

// TestStockctl_Watch: watch ledger prints each entry with the cursor after
// it (-json: one object a line) until interrupted, and exits 0; resumed
// from that cursor it prints only what came after; a forged cursor is
// refused (exit 3); watch stock prints the stock as it changes.
func TestStockctl_Watch(t *testing.T) {
	// A cluster of its own (the later -database-url wins): the stream waits
	// for the whole cluster's oldest transaction (docs/changestream.md).
	base := stackWith(t, "-database-url", pgtest.NewPrivateDBs(t, 1)[0])
	env := map[string]string{"SHARDSTOCK_URL": base, "SHARDSTOCK_ADMIN_TOKEN": token}
	if code, out, errs := ctl(t, env, "create-sku", "w", "-stock", "10"); code != 0 {
		t.Fatalf("create-sku: exit %d\n%s%s", code, out, errs)
	}
	adjust := func(key string) {
		t.Helper()
		if code, out, errs := ctl(t, env, "adjust-stock", "w", "-delta", "1", "-reason", "r", "-approver", "a", "-key", key); code != 0 {
			t.Fatalf("adjust-stock: exit %d\n%s%s", code, out, errs)
		}
	}
	adjust("adj-1")
	code, out := follow(t, env, "adj-1", "-json", "watch", "ledger", "-sku", "w", "-consumer", "stockctl-test")
	var m struct {
		Entry  struct{ IdempotencyKey string }
		Cursor string
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &m); code != 0 || err != nil || m.Entry.IdempotencyKey != "adj-1" || m.Cursor == "" {
		t.Fatalf("watch ledger -json: exit %d, %q (%v): want one entry, adj-1, with a cursor, and exit 0", code, out, err)
	}
	adjust("adj-2")
	if code, out := follow(t, env, "adj-2", "watch", "ledger", "-cursor", m.Cursor); code != 0 || strings.Contains(out, "adj-1") {
		t.Errorf("watch ledger -cursor: exit %d, %q: want adj-2 and not adj-1", code, out)
	}
	if code, out, errs := ctl(t, env, "watch", "ledger", "-cursor", "c1.forged"); code != stockctlcmd.ExitRefused {
		t.Errorf("watch ledger from a forged cursor: exit %d, want %d\n%s%s", code, stockctlcmd.ExitRefused, out, errs)
	}
	if code, out := follow(t, env, "SNAPSHOT", "watch", "stock", "w"); code != 0 || !strings.Contains(out, "12") {
		t.Errorf("watch stock: exit %d, %q: want a snapshot of 12 available", code, out)
	}
}
