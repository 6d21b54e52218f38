package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/cmdtest"
)

// testCheckInterval is certCheckInterval in these tests.
const testCheckInterval = 100 * time.Millisecond

// seenWithin bounds how long a rotation may take to show: the interval,
// and slack for a loaded shared machine.
const seenWithin = testCheckInterval + 2*time.Second

// place copies src to dst as a Secret update does: a new file renamed over
// the old one.
func place(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// files are the paths a process is configured with, in a directory of t's.
type files struct{ cert, key, ca string }

func newFiles(t *testing.T) files {
	dir := t.TempDir()
	return files{filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem")}
}

// put places a certificate, its key and (if ca is set) a CA file.
func (f files) put(t *testing.T, cert, key string, ca *cmdtest.CA) {
	t.Helper()
	place(t, cert, f.cert)
	place(t, key, f.key)
	if ca != nil {
		place(t, ca.File, f.ca)
	}
}

// syncBuffer is a log destination the test reads while handshakes write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serveTLS serves h over TLS with cfg on 127.0.0.1 until the test ends.
func serveTLS(t *testing.T, cfg *tls.Config, h http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeTLS(ctx, lis, h, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return lis.Addr().String()
}

// serverName is the name of the certificate a new handshake with addr
// gets; "" if the handshake fails.
func serverName(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		return ""
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// waitName waits until new handshakes with addr see the certificate named
// want, and fails the test after seenWithin.
func waitName(t *testing.T, addr string, roots *x509.CertPool, want string) {
	t.Helper()
	start := time.Now()
	for got := ""; got != want; got = serverName(t, addr, roots) {
		if time.Since(start) > seenWithin {
			t.Fatalf("new handshakes got %q after %v, want %q", got, seenWithin, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s seen after %v", want, time.Since(start).Round(time.Millisecond))
}

// getTLS calls url on c and returns the body, the name of the server's
// certificate and whether the connection was one already open.
func getTLS(t *testing.T, c *http.Client, url string) (body, server string, reused bool) {
	t.Helper()
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s, want 200", url, resp.StatusCode, b)
	}
	return string(b), resp.TLS.PeerCertificates[0].Subject.CommonName, reused
}

func TestCertFiles_ServerRotates(t *testing.T) {
	caA, caB := cmdtest.NewCA(t), cmdtest.NewCA(t)
	roots := caA.Pool.Clone()
	roots.AppendCertsFromPEM(mustRead(t, caB.File))
	aCert, aKey := caA.Issue(t, "server-a")
	bCert, bKey := caB.Issue(t, "server-b")
	f := newFiles(t)
	f.put(t, aCert, aKey, nil)
	cf, err := newCertFiles(f.cert, f.key, "", testCheckInterval, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cf.serverConfig(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	defer old.CloseIdleConnections()
	url := "https://" + addr + "/"
	if _, name, _ := getTLS(t, old, url); name != "server-a" {
		t.Fatalf("before: server certificate %q, want server-a", name)
	}

	f.put(t, bCert, bKey, nil)
	waitName(t, addr, roots, "server-b")
	// The connection opened with A is still open and serves.
	if _, name, reused := getTLS(t, old, url); name != "server-a" || !reused {
		t.Fatalf("old connection: certificate %q, reused %v; want server-a, true", name, reused)
	}
}

func TestCertFiles_HalfWritten(t *testing.T) {
	ca := cmdtest.NewCA(t)
	aCert, aKey := ca.Issue(t, "server-a")
	bCert, bKey := ca.Issue(t, "server-b")
	f := newFiles(t)
	f.put(t, aCert, aKey, nil)
	var logs syncBuffer
	cf, err := newCertFiles(f.cert, f.key, "", testCheckInterval, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cf.serverConfig(), http.NotFoundHandler())

	// The certificate is new, the key still the old one: A stays, over
	// several checks, and the failure is logged once.
	place(t, bCert, f.cert)
	for end := time.Now().Add(5 * testCheckInterval); time.Now().Before(end); time.Sleep(testCheckInterval / 4) {
		if got := serverName(t, addr, ca.Pool); got != "server-a" {
			t.Fatalf("half-written pair: new handshake got %q, want server-a", got)
		}
	}
	if n := strings.Count(logs.String(), "not reloaded"); n != 1 {
		t.Fatalf("half-written pair logged %d times, want once:\n%s", n, logs.String())
	}
	place(t, bKey, f.key)
	waitName(t, addr, ca.Pool, "server-b")
}

func TestCertFiles_ClientRotates(t *testing.T) {
	caA, caB := cmdtest.NewCA(t), cmdtest.NewCA(t)
	srvACert, srvAKey := caA.Issue(t, "server-a")
	srvBCert, srvBKey := caB.Issue(t, "server-b")
	cliACert, cliAKey := caA.Issue(t, "client-a")
	cliBCert, cliBKey := caB.Issue(t, "client-b")

	// The shard server verifies client certificates against its CA file.
	srv := newFiles(t)
	srv.put(t, srvACert, srvAKey, caA)
	srvFiles, err := newCertFiles(srv.cert, srv.key, srv.ca, testCheckInterval, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := RequireClientCert(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}), "/")
	url := "https://" + serveTLS(t, srvFiles.serverConfig(), h) + "/"

	// The allocator presents its certificate and trusts its CA file.
	cli := newFiles(t)
	cli.put(t, cliACert, cliAKey, caA)
	cliFiles, err := newCertFiles(cli.cert, cli.key, cli.ca, testCheckInterval, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := NewInternalTLSClient(cliFiles)
	defer c.CloseIdleConnections() // before the server shuts down: it waits for open ones
	if got, _, _ := getTLS(t, c, url); got != "client-a" {
		t.Fatalf("before: the server saw %q, want client-a", got)
	}

	// Everything moves to CA B, the server's files and the client's.
	srv.put(t, srvBCert, srvBKey, caB)
	cli.put(t, cliBCert, cliBKey, caB)
	time.Sleep(testCheckInterval)
	if got, server, reused := getTLS(t, c, url); got != "client-a" || server != "server-a" || !reused {
		t.Fatalf("old connection: client %q, server %q, reused %v; want client-a, server-a, true", got, server, reused)
	}
	start := time.Now()
	for {
		c.CloseIdleConnections()
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) == "client-b" && resp.TLS.PeerCertificates[0].Subject.CommonName == "server-b" {
				break
			}
		}
		if time.Since(start) > seenWithin {
			t.Fatalf("a new connection after %v: %v; want client-b to server-b", seenWithin, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("client-b to server-b after %v", time.Since(start).Round(time.Millisecond))

	// The old CA is out: a client that trusts only A refuses the server,
	// and the server refuses a client certificate that A signed.
	old := newFiles(t)
	old.put(t, cliACert, cliAKey, caA)
	oldFiles, err := newCertFiles(old.cert, old.key, old.ca, testCheckInterval, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewInternalTLSClient(oldFiles).Get(url); err == nil {
		t.Fatal("a client trusting only CA A reached the server with B's certificate")
	}
	old.put(t, cliACert, cliAKey, caB)
	time.Sleep(testCheckInterval)
	if resp, err := NewInternalTLSClient(oldFiles).Get(url); err == nil {
		resp.Body.Close()
		t.Fatalf("the server accepted client-a (CA A) after its client CA moved to B: %d", resp.StatusCode)
	}
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
