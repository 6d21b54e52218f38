package stockctlcmd_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/cmd/stockctlcmd"
	"github.com/shardstock/shardstock/internal/cmdtest"
)

// TestStockctl_Tokens drives admission through stockctl on a real stack:
// create-sku under admission, request-token answering a token then a
// waiting ticket (and the same token again for its key), ticket by id and
// by sku and key, stock showing tokens outstanding and the waitlist, and
// watch-ticket following a ticket to ADMITTED, cancel-ticket, and the
// exit code of each refusal.
func TestStockctl_Tokens(t *testing.T) {
	base := stack(t)
	env := map[string]string{"SHARDSTOCK_URL": base, "SHARDSTOCK_ADMIN_TOKEN": token}
	must := func(args ...string) string {
		t.Helper()
		code, out, errs := ctl(t, env, args...)
		if code != 0 {
			t.Fatalf("stockctl %v: exit %d\n%s%s", args, code, out, errs)
		}
		return out
	}
	must("create-sku", "drop", "-stock", "1", "-shards", "1", "-admission", "tokens", "-waitlist-max", "5", "-token-ttl", "10m")
	must("create-sku", "plain", "-stock", "1", "-shards", "1")

	type answer struct {
		Token struct {
			TokenID string `json:"tokenId"`
		} `json:"token"`
		Ticket struct {
			TicketID string `json:"ticketId"`
			State    string `json:"state"`
			Position string `json:"position"`
		} `json:"ticket"`
		Replayed bool `json:"replayed"`
	}
	decode := func(out string) answer {
		t.Helper()
		var a answer
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		return a
	}
	first := decode(must("-json", "request-token", "drop", "-key", "first"))
	if first.Token.TokenID == "" {
		t.Fatalf("request-token drop -key first: no token")
	}
	if again := decode(must("-json", "request-token", "drop", "-key", "first")); again.Token.TokenID != first.Token.TokenID || !again.Replayed {
		t.Errorf("request-token again = %+v, want token %s replayed", again, first.Token.TokenID)
	}
	out := must("request-token", "drop", "-key", "second")
	if !strings.Contains(out, "TICKET") || !strings.Contains(out, "WAITING") {
		t.Errorf("request-token with no unit free printed %q, want a WAITING ticket", out)
	}
	waiting := decode(must("-json", "request-token", "drop", "-key", "second"))
	id := waiting.Ticket.TicketID
	if id == "" || waiting.Ticket.State != "TICKET_STATE_WAITING" {
		t.Fatalf("request-token drop -key second = %+v, want a waiting ticket", waiting)
	}
	for _, args := range [][]string{{"ticket", id}, {"ticket", "-sku", "drop", "-key", "second"}} {
		if out := must(args...); !strings.Contains(out, id) || !strings.Contains(out, "WAITING") {
			t.Errorf("stockctl %v printed %q, want ticket %s WAITING", args, out, id)
		}
	}
	if out := must("stock", "drop"); !strings.Contains(out, "TOKENS OUTSTANDING") {
		t.Errorf("stock drop printed %q, want the tokens outstanding and the waitlist", out)
	}
	var st struct {
		Stock struct {
			TokensOutstanding string `json:"tokensOutstanding"`
			WaitlistLength    string `json:"waitlistLength"`
		} `json:"stock"`
	}
	if err := json.Unmarshal([]byte(must("-json", "stock", "drop")), &st); err != nil || st.Stock.TokensOutstanding != "1" || st.Stock.WaitlistLength != "1" {
		t.Errorf("stock -json drop: %+v (%v), want 1 token outstanding and 1 waiting", st.Stock, err)
	}

	// stock shows a draw's state.
	must("create-sku", "lottery", "-stock", "1", "-shards", "1", "-admission", "draw", "-draw-at", "+1h", "-waitlist-max", "5")
	if out := must("stock", "lottery"); !strings.Contains(out, "DRAW AT") || !strings.Contains(out, "REGISTERING") {
		t.Errorf("stock lottery printed %q, want its draw REGISTERING", out)
	}
	if out := must("stock", "drop"); strings.Contains(out, "DRAW AT") {
		t.Errorf("stock drop printed %q, want no draw", out)
	}

	// watch-ticket follows the waiting ticket to its outcome: a unit added
	// goes to it, and the stream ends with it ADMITTED.
	var wo, we cmdtest.Output
	watched := make(chan int, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		watched <- stockctlcmd.Run(ctx, []string{"-json", "watch-ticket", id}, func(k string) string { return env[k] }, &wo, &we)
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(wo.String(), "WAITING"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("watch-ticket %s printed %q%q in 30 s, want its WAITING line", id, wo.String(), we.String())
		}
	}
	must("adjust-stock", "drop", "-delta", "1", "-reason", "r", "-approver", "a", "-key", "more")
	select {
	case code := <-watched:
		lines := strings.Split(strings.TrimSpace(wo.String()), "\n")
		last := decode(lines[len(lines)-1])
		if code != 0 || len(lines) < 2 || last.Ticket.State != "TICKET_STATE_ADMITTED" || last.Ticket.TicketID != id {
			t.Errorf("watch-ticket %s: exit %d, %q%q; want WAITING, then ADMITTED, then exit 0", id, code, wo.String(), we.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("watch-ticket %s: no end 30 s after a unit came back; printed %q", id, wo.String())
	}

	// cancel-ticket takes a waiting ticket out; again, it answers it as it
	// ended; watch-ticket of an ended ticket prints it and ends.
	third := decode(must("-json", "request-token", "drop", "-key", "third"))
	if third.Ticket.State != "TICKET_STATE_WAITING" {
		t.Fatalf("request-token drop -key third = %+v, want a waiting ticket", third)
	}
	for range 2 {
		if got := decode(must("-json", "cancel-ticket", third.Ticket.TicketID)); got.Ticket.State != "TICKET_STATE_CANCELLED" {
			t.Errorf("cancel-ticket %s = %+v, want CANCELLED", third.Ticket.TicketID, got)
		}
	}
	if out := must("watch-ticket", third.Ticket.TicketID); !strings.Contains(out, "TICKET") || !strings.Contains(out, "CANCELLED") {
		t.Errorf("watch-ticket of a cancelled ticket printed %q, want its CANCELLED row", out)
	}
	if out := must("ticket", third.Ticket.TicketID); !strings.Contains(out, "CANCELLED") {
		t.Errorf("ticket %s after cancel-ticket printed %q, want CANCELLED", third.Ticket.TicketID, out)
	}

	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"no key", []string{"request-token", "drop"}, stockctlcmd.ExitUsage},
		{"ticket id and key", []string{"ticket", id, "-sku", "drop", "-key", "second"}, stockctlcmd.ExitUsage},
		{"quantity zero", []string{"request-token", "drop", "-key", "q0", "-quantity", "0"}, stockctlcmd.ExitRefused},
		{"without admission", []string{"request-token", "plain", "-key", "p"}, stockctlcmd.ExitRefused},
		{"unknown SKU", []string{"request-token", "nope", "-key", "n"}, stockctlcmd.ExitNotFound},
		{"unknown ticket", []string{"ticket", "tkt_00000000000000000000000000000000"}, stockctlcmd.ExitNotFound},
		{"unknown key", []string{"ticket", "-sku", "drop", "-key", "never"}, stockctlcmd.ExitNotFound},
		{"cancel without id", []string{"cancel-ticket"}, stockctlcmd.ExitUsage},
		{"cancel unknown ticket", []string{"cancel-ticket", "tkt_00000000000000000000000000000000"}, stockctlcmd.ExitNotFound},
		{"cancel oversized id", []string{"cancel-ticket", strings.Repeat("t", 37)}, stockctlcmd.ExitRefused},
		{"watch without id", []string{"watch-ticket"}, stockctlcmd.ExitUsage},
		{"watch unknown ticket", []string{"watch-ticket", "tkt_00000000000000000000000000000000"}, stockctlcmd.ExitNotFound},
		{"watch oversized id", []string{"watch-ticket", strings.Repeat("t", 37)}, stockctlcmd.ExitRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, out, errs := ctl(t, env, tc.args...); code != tc.want {
				t.Errorf("stockctl %v: exit %d, want %d\n%s%s", tc.args, code, tc.want, out, errs)
			}
		})
	}
}
