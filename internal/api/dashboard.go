package api

import (
	"embed"
	"io/fs"
	"net/http"
)

// dashboardFiles is the dashboard as built from web/dashboard
// (npm run build:dashboard in web/, or make dashboard): committed, so that
// the binaries need no npm.
//
//go:embed dashboard/index.html dashboard/app.js dashboard/app.css
var dashboardFiles embed.FS

// Dashboard serves the dashboard: its page at /, its script and style by
// name, and 404 for anything else.
func Dashboard() http.Handler {
	sub, err := fs.Sub(dashboardFiles, "dashboard")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/", "/app.js", "/app.css":
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			w.Header().Set("Cache-Control", "no-cache")
			files.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	})
}
