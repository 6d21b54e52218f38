package allocator_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/admission"
	"github.com/shardstock/shardstock/internal/faultproxy"
	"github.com/shardstock/shardstock/internal/postgres"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestAdmission_DatabaseDown: while the tickets' database does not answer
// (every connection to it cut, none taken), RequestToken (new key and
// retried key), GetTicket (by id and by key), CancelTicket and the
// waitlist's length answer SHARD_UNAVAILABLE, the code the API asks
// clients to retry with the same key, not INTERNAL, which they must not
// retry; and nothing changed: the waiting ticket still waits, no new
// ticket was recorded. (TestE2E_TokensUnderFaults found the INTERNAL
// while Postgres restarted: its customers, retrying only what the API
// says is safe, gave up on their tickets.)
func TestAdmission_DatabaseDown(t *testing.T) {
	s := newStack(t, []string{"a"}, "")
	ctx := context.Background()
	const sku = "down-1"
	s.createAdmissionSKU(sku, 1, 1, stock.Admission{Mode: stock.AdmissionTokens, TokenTTL: time.Minute, WaitlistMax: 10})
	proxy, proxied, err := faultproxy.StartPostgres(s.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	tickets, err := postgres.Open(ctx, proxied, postgres.Options{MaxConns: 2, ApplicationName: "admission-down"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tickets.Close)
	svc := admission.New(tickets, s.alloc, nil) // no worker: the ticket stays waiting
	request := func(key string) (admission.Answer, error) {
		return svc.RequestToken(ctx, admission.TokenRequest{SKU: sku, Quantity: 1, Key: key})
	}
	if ans, err := request("k-1"); err != nil || ans.Ticket.State != stock.TicketAdmitted {
		t.Fatalf("RequestToken(k-1) = %+v, %v; want the one unit's token", ans.Ticket, err)
	}
	ans, err := request("k-2")
	if err != nil || ans.Ticket.State != stock.TicketWaiting {
		t.Fatalf("RequestToken(k-2) = %+v, %v; want a waiting ticket", ans.Ticket, err)
	}
	waiting := ans.Ticket.ID

	proxy.Close() // the database gone: open connections cut, new ones refused
	calls := map[string]func() error{
		"RequestToken(new key)": func() error { _, err := request("k-3"); return err },
		"RequestToken(k-2)":     func() error { _, err := request("k-2"); return err },
		"GetTicket(id)":         func() error { _, err := svc.GetTicket(ctx, waiting, "", ""); return err },
		"GetTicket(sku, key)":   func() error { _, err := svc.GetTicket(ctx, "", sku, "k-2"); return err },
		"CancelTicket":          func() error { _, err := svc.CancelTicket(ctx, waiting, ""); return err },
		"Waitlist":              func() error { _, err := svc.Waitlist(ctx, sku); return err },
	}
	for name, call := range calls {
		if err := call(); stock.CodeOf(err) != stock.CodeShardUnavailable {
			t.Errorf("%s with the database down = %v (%s), want %s", name, err, stock.CodeOf(err), stock.CodeShardUnavailable)
		}
	}

	direct := admission.New(s.db, s.alloc, nil)
	if got, err := direct.GetTicket(ctx, waiting, "", ""); err != nil || got.State != stock.TicketWaiting {
		t.Errorf("ticket %s after the calls = %+v, %v; want it still waiting", waiting, got, err)
	}
	if _, err := direct.GetTicket(ctx, "", sku, "k-3"); stock.CodeOf(err) != stock.CodeTicketNotFound {
		t.Errorf("GetTicket(k-3) = %v, want %s: nothing recorded while the database was down", err, stock.CodeTicketNotFound)
	}
}
