package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// webDir holds the Connect-ES clients and their Node tests (npm ci --prefix
// web installs their packages; make test does).
const webDir = "../../web"

// TestE2E_WebClients runs web/test/clients.test.mjs: Node reserves and
// commits through @connectrpc/connect-web's Connect and gRPC-Web
// transports, the ones a browser uses, against a real stack.
func TestE2E_WebClients(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found: the Connect-ES clients are tested with Node.js (install it; see README)")
	}
	if _, err := os.Stat(filepath.Join(webDir, "node_modules", "@connectrpc", "connect-web")); err != nil {
		t.Fatalf("web/node_modules is missing: run npm ci --prefix web (make test does)")
	}
	s := newStack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "test/")
	cmd.Dir = webDir
	cmd.Env = append(os.Environ(), "SHARDSTOCK_URL="+s.base, "SHARDSTOCK_ADMIN_TOKEN="+adminToken)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
}
