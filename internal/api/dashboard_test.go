package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDashboard(t *testing.T) {
	h := Dashboard()
	for _, tc := range []struct {
		method, path string
		status       int
		ctype, body  string
	}{
		{"GET", "/", 200, "text/html", `src="app.js"`},
		{"GET", "/app.js", 200, "javascript", "shardstock"},
		{"GET", "/app.css", 200, "text/css", ".shard"},
		{"HEAD", "/", 200, "text/html", ""},
		{"GET", "/index.html", 404, "", ""},
		{"GET", "/secrets", 404, "", ""},
		{"GET", "/../go.mod", 404, "", ""},
		{"POST", "/", 405, "", ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, rec.Code, tc.status)
			continue
		}
		if tc.status != http.StatusOK {
			continue
		}
		if ct := rec.Header().Get("Content-Type"); !strings.Contains(ct, tc.ctype) {
			t.Errorf("%s %s: Content-Type %q, want %s", tc.method, tc.path, ct, tc.ctype)
		}
		if !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s %s: body lacks %q", tc.method, tc.path, tc.body)
		}
	}
}
