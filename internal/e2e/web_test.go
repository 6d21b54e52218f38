package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/auth"
	"github.com/shardstock/shardstock/internal/auth/authtest"
	"github.com/shardstock/shardstock/internal/pgtest"
)

// webDir holds the Connect-ES clients and their Node tests (npm ci --prefix
// web installs their packages; make test does).
const webDir = "../../web"

// TestE2E_WebClients runs web/test/clients.test.mjs: Node reserves and
// commits with a service JWT through @connectrpc/connect-web's Connect and
// gRPC-Web transports, the ones a browser uses, against a real stack that
// verifies JWTs against a JWKS, and watches a SKU sell out and come back
// (WatchStock over gRPC-Web).
func TestE2E_WebClients(t *testing.T) {
	besideOthers(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found: the Connect-ES clients are tested with Node.js (install it; see README)")
	}
	if _, err := os.Stat(filepath.Join(webDir, "node_modules", "@connectrpc", "connect-web")); err != nil {
		t.Fatalf("web/node_modules is missing: run npm ci --prefix web (make test does)")
	}
	// A cluster of its own: WatchStock's SOLD_OUT within a second must not
	// wait for other tests' transactions on a shared server (the change
	// stream waits for the whole cluster's oldest; docs/changestream.md).
	iss := authtest.NewIssuer(t, "web-key")
	s := newStackOpts(t, stackOpts{shardServers: 1, ttl: leaseTTL, dbURL: pgtest.NewPrivateDBs(t, 1)[0],
		allocArgs: []string{"-jwks", iss.WriteJWKS(t), "-jwt-issuer", authtest.Issuer, "-jwt-audience", authtest.Audience}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "test/clients.test.mjs")
	cmd.Dir = webDir
	cmd.Env = append(os.Environ(), "SHARDSTOCK_URL="+s.base, "SHARDSTOCK_ADMIN_TOKEN="+adminToken,
		"SHARDSTOCK_SERVICE_JWT="+iss.Sign(t, auth.RoleService, "web-backend"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
}

// TestE2E_Dashboard drives the dashboard in headless Chromium (Debian's
// chromium, through playwright-core from web/node_modules) on the stack
// `make run` starts, as a new user meets it: make run itself (building
// cmd/shardstock-dev and running it with its defaults), on a free port
// with a database of its own. The page is opened at the address the
// banner prints, and with no typing it lists and shows the demo SKU,
// whose charts move and grow under a bounded load of deducts, live from
// WatchStock (no GetStock sent); then it creates a SKU through the page,
// deducts from the script, sees the bars move, pauses the SKU through the
// page and sees it paused, and sees a refund and an order's line labelled
// in its ledger view (web/test/dashboard.test.mjs). The screenshots
// go to the test's artifact directory (t.ArtifactDir: kept with go test
// -artifacts), or to ARTIFACTS_DIR if set; the log names it.
func TestE2E_Dashboard(t *testing.T) {
	besideOthers(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found: the dashboard is tested with Node.js and playwright-core (install it; see README)")
	}
	chromium := os.Getenv("CHROMIUM")
	if chromium == "" {
		if chromium, err = exec.LookPath("chromium"); err != nil {
			t.Fatalf("chromium not found: the dashboard is tested in headless Chromium (Debian: apt-get install chromium; .ci/run does it)")
		}
	}
	if _, err := os.Stat(filepath.Join(webDir, "node_modules", "playwright-core")); err != nil {
		t.Fatalf("web/node_modules is missing playwright-core: run npm ci --prefix web (make test does)")
	}
	artifacts := os.Getenv("ARTIFACTS_DIR")
	if artifacts == "" {
		artifacts = t.ArtifactDir()
	}
	t.Logf("screenshots: %s", artifacts)
	m := startMakeRun(t, pgtest.NewMigratedDB(t))
	banner := strings.Join(m.waitBanner(t), "\n")
	page, demo := dashboardURL.FindStringSubmatch(banner), bannerSKU.FindStringSubmatch(banner)
	if page == nil || demo == nil {
		t.Fatalf("the banner names no dashboard address or no demo SKU:\n%s", banner)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "test/dashboard.test.mjs")
	cmd.Dir = webDir
	cmd.Env = append(os.Environ(), "SHARDSTOCK_URL=http://"+m.addr, "SHARDSTOCK_DASHBOARD_URL="+page[1], "SHARDSTOCK_DEMO_SKU="+demo[1],
		"SHARDSTOCK_ADMIN_TOKEN="+adminToken, "CHROMIUM="+chromium, "ARTIFACTS_DIR="+artifacts)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test test/dashboard.test.mjs: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
	m.signal(t, -m.pgid, syscall.SIGTERM)
	m.checkStopped(t, m.tree())
}

// dashboardURL is the dashboard's address in make run's banner (its
// "(dashboard: URL; ...)"), bannerSKU the demo SKU its examples use.
var (
	dashboardURL = regexp.MustCompile(`dashboard: (http://[^;\s]+)`)
	bannerSKU    = regexp.MustCompile(`'\{"sku":"([^"]+)"`)
)
