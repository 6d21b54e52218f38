package e2e

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// TestE2E_HaltAndResume: a shard whose row was changed behind its writer,
// with no ledger entry, halts; GetStock and /metrics say so and why; an
// operator's ResumeShard (reason and approver required) lets it serve again.
func TestE2E_HaltAndResume(t *testing.T) {
	besideOthers(t)
	s := newStackWith(t, 0, "local")
	ctx := context.Background()
	const sku = "halt"
	s.createSKU(sku, 100, 1)
	if _, err := s.deduct(ctx, sku, "h-1", 1); err != nil {
		t.Fatalf("Deduct(h-1) = %v", err)
	}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE shards SET available = available - 5 WHERE sku = $1`, sku); err != nil {
		t.Fatal(err)
	}

	if _, err := s.deduct(ctx, sku, "h-2", 1); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("Deduct(h-2) after an unledgered change = %v, want unavailable (halted)", err)
	}
	if r := s.stock(sku).Shards[0].HaltedReason; r == "" {
		t.Errorf("GetStock shard 0 halted_reason is empty, want why it halted")
	}
	if v := s.counter(`shardstock_shard_halted{shard="0",sku="halt"}`); v != 1 {
		t.Errorf("shardstock_shard_halted = %v, want 1", v)
	}

	resume := func(m *v1.ResumeShardRequest) (*v1.ResumeShardResponse, error) {
		resp, err := s.admin.ResumeShard(ctx, adminReq(m))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	if _, err := resume(&v1.ResumeShardRequest{Sku: sku, Reason: "looked: a manual fix in psql"}); reason(err) != "INVALID_ARGUMENT" {
		t.Errorf("ResumeShard without an approver = %v, want INVALID_ARGUMENT", err)
	}
	if _, err := s.admin.ResumeShard(ctx, connect.NewRequest(&v1.ResumeShardRequest{Sku: sku, Reason: "x", Approver: "y"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("ResumeShard without the token = %v, want unauthenticated", err)
	}
	r, err := resume(&v1.ResumeShardRequest{Sku: sku, Reason: "looked: a manual fix in psql", Approver: "alice"})
	if err != nil || r.HaltedReason == "" || r.Stock.Shards[0].HaltedReason != "" {
		t.Fatalf("ResumeShard = %v, %v; want the old reason, and the shard no longer halted", r, err)
	}
	if _, err := resume(&v1.ResumeShardRequest{Sku: sku, Reason: "again", Approver: "alice"}); reason(err) != "SHARD_NOT_HALTED" ||
		connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("ResumeShard of a running shard = %v, want failed_precondition SHARD_NOT_HALTED", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.deduct(ctx, sku, "h-3", 1)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Deduct(h-3) after ResumeShard = %v for 10s, want a success", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st := s.stock(sku); st.Available != 93 || st.Sold != 2 {
		t.Errorf("stock after resume = %d available, %d sold; want 93 and 2 (the row as resumed)", st.Available, st.Sold)
	}
	if v := s.counter(`shardstock_shard_halted{shard="0",sku="halt"}`); v != 0 {
		t.Errorf("shardstock_shard_halted after resume = %v, want 0 (absent)", v)
	}
}
