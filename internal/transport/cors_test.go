package transport_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shardstock/shardstock/internal/transport"
)

// A preflight from an allowed origin is answered with that origin, the
// Connect headers and Authorization; one from another origin, or with no
// origins configured, gets no CORS headers, so the browser refuses it.
func TestCORS(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	preflight := func(srv http.Handler, origin string) *http.Response {
		r := httptest.NewRequest(http.MethodOptions, "/shardstock.v1.InventoryService/GetStock", nil)
		r.Header.Set("Origin", origin)
		r.Header.Set("Access-Control-Request-Method", http.MethodPost)
		r.Header.Set("Access-Control-Request-Headers", "authorization,connect-protocol-version,content-type") // as browsers send them: lower case, sorted
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w.Result()
	}
	allowed := transport.CORS(h, []string{"https://shop.example.com"})
	resp := preflight(allowed, "https://shop.example.com")
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "https://shop.example.com" {
		t.Errorf("allowed origin: Access-Control-Allow-Origin = %q", got)
	}
	if got := resp.Header.Get("Access-Control-Allow-Headers"); got == "" {
		t.Errorf("allowed origin: no Access-Control-Allow-Headers")
	}
	if resp.StatusCode >= 300 {
		t.Errorf("allowed origin: preflight status %d", resp.StatusCode)
	}
	if got := preflight(allowed, "https://evil.example.com").Header.Get("Access-Control-Allow-Origin"); got != "" {
		t.Errorf("other origin: Access-Control-Allow-Origin = %q, want none", got)
	}
	if got := preflight(transport.CORS(h, nil), "https://shop.example.com").Header.Get("Access-Control-Allow-Origin"); got != "" {
		t.Errorf("no origins configured: Access-Control-Allow-Origin = %q, want none", got)
	}
}
