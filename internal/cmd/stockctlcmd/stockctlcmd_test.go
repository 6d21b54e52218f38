package stockctlcmd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/auth/authtest"
	"github.com/shardstock/shardstock/internal/cmd/allocatorcmd"
	"github.com/shardstock/shardstock/internal/cmd/stockctlcmd"
	"github.com/shardstock/shardstock/internal/cmdtest"
	"github.com/shardstock/shardstock/internal/etcdtest"
	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/readiness"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/transport"
	"github.com/shardstock/shardstock/internal/wire"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const token = "stockctl-test-token-0123456789"

// stack runs a real allocator with its own shard server (every partition)
// in this process, on Postgres and an embedded etcd, and returns its URL.
func stack(t *testing.T) string {
	t.Helper()
	return stackWith(t)
}

// stackWith is stack with more allocator flags; it returns once the
// allocator says it is ready.
func stackWith(t *testing.T, extra ...string) string {
	t.Helper()
	e := etcdtest.Start(t)
	args := append([]string{"-addr", "127.0.0.1:0", "-database-url", pgtest.NewMigratedDB(t), "-etcd-endpoints", strings.Join(e.Endpoints(), ","),
		"-admin-token", token, "-shard-id", "s1", "-lease-ttl", "5s", "-db-max-conns", "8", "-log-level", "error"}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	var out cmdtest.Output
	done := make(chan error, 1)
	go func() { done <- allocatorcmd.Run(ctx, args, func(string) string { return "" }, &out, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("allocator did not stop")
		}
	})
	return out.WaitReady(t, readiness.RoleAllocator, 30*time.Second).Addr
}

// ctl runs stockctl in-process and returns its exit code and output.
func ctl(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e cmdtest.Output
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code = stockctlcmd.Run(ctx, args, func(k string) string { return env[k] }, &o, &e)
	return code, o.String(), e.String()
}

// TestStockctl drives a real stack through stockctl: every command, the
// tables and --json, an import and its re-run, and the exit code of each
// class of error. The admin token appears in no output.
func TestStockctl(t *testing.T) {
	base := stack(t)
	env := map[string]string{"SHARDSTOCK_URL": base, "SHARDSTOCK_ADMIN_TOKEN": token}
	must := func(args ...string) string {
		t.Helper()
		code, out, errs := ctl(t, env, args...)
		if code != 0 {
			t.Fatalf("stockctl %v: exit %d\n%s%s", args, code, out, errs)
		}
		if strings.Contains(out+errs, token) {
			t.Fatalf("stockctl %v printed the admin token", args)
		}
		return out
	}

	out := must("create-sku", "tee", "-stock", "100", "-shards", "4", "-max-per-order", "5")
	if !strings.Contains(out, "tee") || !strings.Contains(out, "100") {
		t.Errorf("create-sku printed %q", out)
	}
	if out := must("stock", "tee"); !strings.Contains(out, "SHARD") || strings.Count(out, "\n") < 7 {
		t.Errorf("stock printed %q, want the SKU and 4 shard rows", out)
	}
	must("adjust-stock", "tee", "-delta", "20", "-reason", "found a box", "-approver", "alice", "-key", "adj-1")
	var st struct {
		Stock struct {
			Available string `json:"available"`
		} `json:"stock"`
	}
	if err := json.Unmarshal([]byte(must("-json", "stock", "tee")), &st); err != nil || st.Stock.Available != "120" {
		t.Errorf("stock --json: available %q (%v), want 120", st.Stock.Available, err)
	}
	must("pause", "tee")
	if out := must("update-sku", "tee", "-paused=false", "-customer-limit", "3"); !strings.Contains(out, "ACTIVE") {
		t.Errorf("update-sku printed %q, want the SKU active", out)
	}
	if out := must("rebalance", "tee", "-dry-run"); !strings.Contains(out, "FROM") {
		t.Errorf("rebalance -dry-run printed %q", out)
	}
	must("rebalance", "tee", "-wait")
	must("set-shards", "tee", "8")
	var transfers struct {
		Transfers []struct {
			Sku string `json:"sku"`
		} `json:"transfers"`
	}
	if err := json.Unmarshal([]byte(must("-json", "transfers", "-sku", "tee", "-all")), &transfers); err != nil {
		t.Fatalf("transfers --json: %v", err)
	}
	if out := must("ledger", "tee", "-all"); !strings.Contains(out, "adjust") {
		t.Errorf("ledger printed %q, want the adjustment", out)
	}
	if out := must("reconcile", "tee"); !strings.Contains(out, "true") {
		t.Errorf("reconcile printed %q, want balanced", out)
	}
	if out := must("topology"); !strings.Contains(out, "s1") || !strings.Contains(out, "main") {
		t.Errorf("topology printed %q, want server s1 and database main", out)
	}
	if out := must("-protocol", "grpc", "stock", "tee"); !strings.Contains(out, "tee") {
		t.Errorf("stock over gRPC printed %q", out)
	}

	// A 200-row import, and again: all skipped.
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "skus.csv")
	var b strings.Builder
	b.WriteString("sku,stock,shards\n")
	for i := range 200 {
		fmt.Fprintf(&b, "imp-%03d,%d,2\n", i, 10+i)
	}
	if err := os.WriteFile(csvPath, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var sum struct{ Created, Skipped, Failed int }
	if err := json.Unmarshal([]byte(must("-json", "import", csvPath)), &sum); err != nil || sum.Created != 200 || sum.Skipped != 0 || sum.Failed != 0 {
		t.Errorf("import = %+v (%v), want 200 created", sum, err)
	}
	if err := json.Unmarshal([]byte(must("-json", "import", "-progress", csvPath)), &sum); err != nil || sum.Created != 0 || sum.Skipped != 200 {
		t.Errorf("import again = %+v (%v), want 200 skipped", sum, err)
	}

	// Every SKU, paged by name; prewarm; a sale window that refuses.
	if out := must("skus", "-prefix", "imp-", "-all", "-page-size", "64"); strings.Count(out, "imp-") != 200 || !strings.Contains(out, "imp-199") {
		t.Errorf("skus -prefix imp- -all listed %d imp- SKUs, want 200:\n%s", strings.Count(out, "imp-"), out)
	}
	if out := must("prewarm", "tee"); !strings.Contains(out, "SHARDS WARM") || !strings.Contains(out, "\t8\t") && !strings.Contains(out, " 8 ") {
		t.Errorf("prewarm tee printed %q, want its 8 shards warm", out)
	}
	if out := must("update-sku", "tee", "-sale-start", "+1h"); !strings.Contains(out, "..") {
		t.Errorf("update-sku -sale-start printed %q, want the window", out)
	}
	inv := shardstockv1connect.NewInventoryServiceClient(transport.NewClient(), base, authtest.Bearer(token)) // an admin may act as a service
	_, err := inv.Deduct(context.Background(), connect.NewRequest(&v1.DeductRequest{Sku: "tee", Quantity: 1, IdempotencyKey: "early", CustomerRef: "c1"}))
	var ce *connect.Error
	if !errors.As(err, &ce) || wire.Reason(err) != string(stock.CodeSaleNotStarted) || saleStartOf(ce) == "" {
		t.Errorf("Deduct before the sale starts = %v, want SALE_NOT_STARTED with sale_start in its ErrorInfo", err)
	}
	must("update-sku", "tee", "-clear-sale-window")
	if _, err := inv.Deduct(context.Background(), connect.NewRequest(&v1.DeductRequest{Sku: "tee", Quantity: 1, IdempotencyKey: "early", CustomerRef: "c1"})); err != nil {
		t.Errorf("Deduct after the window was cleared = %v, want a sale", err)
	}

	// An order's line and a refund, as stockctl shows them: the line's
	// operation names its order, the refund the sale it reverses.
	ord, err := inv.ReserveOrder(context.Background(), connect.NewRequest(&v1.ReserveOrderRequest{IdempotencyKey: "cart-1", CustomerRef: "c1",
		Lines: []*v1.OrderLine{{Sku: "tee", Quantity: 1}}}))
	if err != nil {
		t.Fatalf("ReserveOrder = %v", err)
	}
	id := ord.Msg.GetOrder().GetOrderId()
	if out := must("order", id); !strings.Contains(out, "HELD") || !strings.Contains(out, ord.Msg.GetOrder().GetLines()[0].GetReservationId()) {
		t.Errorf("order %s printed %q, want it held with its line's reservation", id, out)
	}
	if out := must("operation", "tee", stock.OrderLineKey(id, "tee")); !strings.Contains(out, id) {
		t.Errorf("operation of the order's line printed %q, want its order %s", out, id)
	}
	if _, err := inv.Refund(context.Background(), connect.NewRequest(&v1.RefundRequest{Sku: "tee", IdempotencyKey: "refund-1", Quantity: 1,
		Original: &v1.Sale{Sale: &v1.Sale_DeductKey{DeductKey: "early"}}, Reason: "payment failed"})); err != nil {
		t.Fatalf("Refund(early) = %v", err)
	}
	if out := must("operation", "tee", "refund-1"); !strings.Contains(out, "REFUND") || !strings.Contains(out, "deduct:early") {
		t.Errorf("operation refund-1 printed %q, want a refund of deduct:early", out)
	}

	// Exit codes by class.
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want int
	}{
		{"bad token", map[string]string{"SHARDSTOCK_URL": base, "SHARDSTOCK_ADMIN_TOKEN": "wrong-token-0123456789"}, []string{"topology"}, stockctlcmd.ExitAuth},
		{"no token", map[string]string{"SHARDSTOCK_URL": base}, []string{"set-shards", "tee", "2"}, stockctlcmd.ExitAuth},
		{"unknown SKU", env, []string{"stock", "nope"}, stockctlcmd.ExitNotFound},
		{"negative delta beyond stock bound", env, []string{"adjust-stock", "tee", "-delta", "-2000000000000", "-reason", "x", "-approver", "y", "-key", "k2"}, stockctlcmd.ExitRefused},
		{"exists", env, []string{"create-sku", "tee", "-stock", "1"}, stockctlcmd.ExitRefused},
		{"bad flag", env, []string{"stock", "-nope", "tee"}, stockctlcmd.ExitUsage},
		{"unknown command", env, []string{"steal"}, stockctlcmd.ExitUsage},
		{"missing argument", env, []string{"set-shards", "tee"}, stockctlcmd.ExitUsage},
		{"bad sale start", env, []string{"update-sku", "tee", "-sale-start", "tomorrow"}, stockctlcmd.ExitUsage},
		{"window ends before it starts", env, []string{"update-sku", "tee", "-sale-start", "+2h", "-sale-end", "+1h"}, stockctlcmd.ExitRefused},
		{"prewarm unknown SKU", env, []string{"prewarm", "nope"}, stockctlcmd.ExitNotFound},
		{"nothing listening", map[string]string{"SHARDSTOCK_URL": "http://" + cmdtest.FreeAddr(t), "SHARDSTOCK_ADMIN_TOKEN": token}, []string{"topology"}, stockctlcmd.ExitUnavailable},
		{"help", env, []string{"help"}, stockctlcmd.ExitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := ctl(t, tc.env, tc.args...)
			if code != tc.want {
				t.Errorf("stockctl %v: exit %d, want %d\n%s%s", tc.args, code, tc.want, out, errs)
			}
			if strings.Contains(out+errs, token) {
				t.Errorf("stockctl %v printed the admin token", tc.args)
			}
			if code != 0 && code != stockctlcmd.ExitUsage && !strings.HasPrefix(errs, "stockctl: ") {
				t.Errorf("stockctl %v: error %q, want stockctl: <code>: <reason>: <message>", tc.args, errs)
			}
		})
	}
}

// TestStockctl_TLS: against an allocator serving TLS with a certificate of
// the test's CA, stockctl trusts it with -ca (Connect and gRPC), fails
// without it, and refuses a -ca that is not a PEM CA as a usage error.
func TestStockctl_TLS(t *testing.T) {
	ca := cmdtest.NewCA(t)
	cert, key := ca.Issue(t, "allocator")
	base := stackWith(t, "-tls-cert", cert, "-tls-key", key)
	env := map[string]string{"SHARDSTOCK_ADMIN_TOKEN": token}
	for _, protocol := range []string{"connect", "grpc"} {
		if code, out, errOut := ctl(t, env, "-url", base, "-ca", ca.File, "-protocol", protocol, "create-sku", "tls-"+protocol, "-stock", "5"); code != 0 {
			t.Errorf("%s over TLS with -ca: exit %d: %s%s", protocol, code, out, errOut)
		}
	}
	if code, _, errOut := ctl(t, map[string]string{"SHARDSTOCK_ADMIN_TOKEN": token, "SHARDSTOCK_CA": ca.File}, "-url", base, "stock", "tls-connect"); code != 0 {
		t.Errorf("SHARDSTOCK_CA: exit %d: %s", code, errOut)
	}
	if code, _, errOut := ctl(t, env, "-url", base, "stock", "tls-connect"); code == 0 || !strings.Contains(errOut, "certificate") {
		t.Errorf("without -ca: exit %d, %q; want a failure naming the certificate", code, errOut)
	}
	if code, _, errOut := ctl(t, env, "-url", base, "-ca", cert+".missing", "stock", "tls-connect"); code != stockctlcmd.ExitUsage {
		t.Errorf("-ca of a missing file: exit %d (%s), want %d", code, errOut, stockctlcmd.ExitUsage)
	}
	if code, _, _ := ctl(t, env, "-url", strings.Replace(base, "https://", "http://", 1), "-ca", ca.File, "stock", "tls-connect"); code != stockctlcmd.ExitUsage {
		t.Errorf("-ca with an http:// -url: exit %d, want %d", code, stockctlcmd.ExitUsage)
	}
}

// saleStartOf is the sale_start of an error's ErrorInfo, or "".
func saleStartOf(ce *connect.Error) string {
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.GetMetadata()[stock.MetaSaleStart]
			}
		}
	}
	return ""
}
