package auth

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// certsMax bounds the client certificates whose verification is
// remembered: one per TLS connection of a service (each handshake parses
// its own), least recently used forgotten first; a few KiB each.
const certsMax = 4096

// verified is a client certificate's remembered verification.
type verified struct {
	pool   *x509.CertPool // it was verified against; another pool verifies again
	until  time.Time      // the earliest NotAfter of its chain
	caller Caller
}

// certs verifies client certificates against the current client CA pool
// and remembers the outcome for each certificate (a connection's requests
// share one *x509.Certificate): a chain's signature checks cost tens of
// microseconds, too much for every request of the hot path.
type certs struct {
	pool func() *x509.CertPool
	mu   sync.Mutex
	seen *lru.Cache[*x509.Certificate, verified]
}

func newCerts(pool func() *x509.CertPool) *certs {
	seen, _ := lru.New[*x509.Certificate, verified](certsMax)
	return &certs{pool: pool, seen: seen}
}

// caller is the service caller a connection's client certificate names, if
// it has one that the current pool verifies for client authentication.
func (c *certs) caller(state *tls.ConnectionState) (Caller, bool) {
	if state == nil || len(state.PeerCertificates) == 0 {
		return Caller{}, false
	}
	pool := c.pool()
	if pool == nil {
		return Caller{}, false
	}
	leaf, now := state.PeerCertificates[0], time.Now()
	c.mu.Lock()
	v, ok := c.seen.Get(leaf)
	c.mu.Unlock()
	if ok && v.pool == pool && now.Before(v.until) {
		return v.caller, v.caller.ID != ""
	}
	v = verified{pool: pool, until: now.Add(time.Minute)}
	intermediates := x509.NewCertPool()
	for _, cert := range state.PeerCertificates[1:] {
		intermediates.AddCert(cert)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: intermediates, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err == nil && len(chains) > 0 {
		// Remembered only while every certificate of the chain is
		// valid: an expired one is verified again, and refused.
		v.until = leaf.NotAfter
		for _, cert := range chains[0] {
			if cert.NotAfter.Before(v.until) {
				v.until = cert.NotAfter
			}
		}
		v.caller = Caller{Role: RoleService, ID: CertID(leaf)}
	}
	// A refusal is remembered for a minute: a connection that keeps
	// sending one costs a verification a minute, not one a request.
	c.mu.Lock()
	c.seen.Add(leaf, v)
	c.mu.Unlock()
	return v.caller, v.caller.ID != ""
}

// CertID is the id of a client certificate in the ledger and the log:
// "cert:" and its subject's common name, else its first DNS name, URI or
// e-mail address (SAN); "cert:sha256:" and the first 12 hex digits of the
// certificate's SHA-256 when it has none, or none that is printable and
// at most subjectLenMax characters.
func CertID(cert *x509.Certificate) string {
	names := []string{cert.Subject.CommonName}
	names = append(names, cert.DNSNames...)
	for _, u := range cert.URIs {
		names = append(names, u.String())
	}
	names = append(names, cert.EmailAddresses...)
	for _, n := range names {
		if n != "" && printable(n) {
			return "cert:" + n
		}
	}
	sum := sha256.Sum256(cert.Raw)
	return "cert:sha256:" + hex.EncodeToString(sum[:6])
}

// printable says whether s may name a caller: at most subjectLenMax
// characters, none a space or a control character.
func printable(s string) bool {
	return len(s) <= subjectLenMax && !strings.ContainsFunc(s, func(r rune) bool { return r < 0x21 || r == 0x7f })
}
