package stockctlcmd_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/internal/cmd/stockctlcmd"
)

// TestStockctl_Tokens drives admission through stockctl on a real stack:
// create-sku under admission, request-token answering a token then a
// waiting ticket (and the same token again for its key), ticket by id and
// by sku and key, stock showing tokens outstanding and the waitlist, and
// the exit code of each refusal.
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, out, errs := ctl(t, env, tc.args...); code != tc.want {
				t.Errorf("stockctl %v: exit %d, want %d\n%s%s", tc.args, code, tc.want, out, errs)
			}
		})
	}
}
