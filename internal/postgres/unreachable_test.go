package postgres_test

import (
	"context"
	"errors"
	"testing"

	connectrpc "connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/shardstock/shardstock/internal/faultproxy"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// TestDB_UnreachableIsRetryable: what the database adapter returns when
// Postgres does not answer (its connections cut and refused, or its
// backend terminated as a shutting-down server does) reaches a client as
// SHARD_UNAVAILABLE, which the API asks clients to retry with the same
// key, and not as INTERNAL, which they must not retry; a fault of the
// call's own (a statement Postgres refuses) stays INTERNAL.
func TestDB_UnreachableIsRetryable(t *testing.T) {
	_, url := mustOpen(t)
	ctx := context.Background()
	proxy, proxied, err := faultproxy.StartPostgres(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	db, err := postgres.Open(ctx, proxied, postgres.Options{MaxConns: 1, ApplicationName: "unreachable"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.GetOperation(ctx, "sku-1", "key-1"); stock.CodeOf(err) != stock.CodeOperationNotFound {
		t.Fatalf("GetOperation before the cut = %v, want %s", err, stock.CodeOperationNotFound)
	}

	// A backend terminated by an operator or a shutdown (SQLSTATE 57P01 or
	// the connection's end, whichever pgx sees first).
	admin := connect(t, url)
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'unreachable'"); err != nil {
		t.Fatal(err)
	}
	_, err = db.GetOperation(ctx, "sku-1", "key-1")
	wantReason(t, "a terminated backend", err, connectrpc.CodeUnavailable, stock.CodeShardUnavailable)

	proxy.Close() // open connections cut, new ones refused
	_, err = db.GetOperation(ctx, "sku-1", "key-1")
	wantReason(t, "the database gone", err, connectrpc.CodeUnavailable, stock.CodeShardUnavailable)

	_, err = admin.Exec(ctx, "SELEC 1")
	wantReason(t, "a statement Postgres refuses", err, connectrpc.CodeInternal, stock.CodeInternal)
}

// wantReason checks the Connect code and ErrorInfo reason that err reaches
// a client with.
func wantReason(t *testing.T, what string, err error, code connectrpc.Code, reason stock.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	var ce *connectrpc.Error
	if !errors.As(wire.ToConnect(err), &ce) {
		t.Fatalf("%s: ToConnect(%v) is no Connect error", what, err)
	}
	got := ""
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				got = info.Reason
			}
		}
	}
	if ce.Code() != code || got != string(reason) {
		t.Errorf("%s: %v reaches a client as %s/%s, want %s/%s", what, err, ce.Code(), got, code, reason)
	}
}
