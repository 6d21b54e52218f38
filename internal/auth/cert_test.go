package auth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/auth"
)

// testCA signs client certificates in memory.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue signs a leaf that tmpl describes (its key, serial and, unless set,
// validity and usage filled in) and returns the TLS state of a
// connection that presented it.
func (ca *testCA) issue(t *testing.T, tmpl x509.Certificate) *tls.ConnectionState {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	}
	if tmpl.ExtKeyUsage == nil {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
}

// TestAuthenticateTLS: a client certificate the configured CAs verify for
// client authentication is a service named by its subject; one of another
// CA, expired or for servers only counts as none; a new pool (a rotated
// CA file) is used at once, past what was remembered; a bearer credential
// of a higher role wins, one refused is refused whatever the certificate.
func TestAuthenticateTLS(t *testing.T) {
	caA, caB := newTestCA(t), newTestCA(t)
	var pool atomic.Pointer[x509.CertPool]
	pool.Store(caA.pool)
	a, err := auth.New(t.Context(), auth.Config{AdminTokens: []string{adminToken}, PublicTokens: []string{"public-token-0123456789"},
		ClientCAs: pool.Load})
	if err != nil {
		t.Fatal(err)
	}
	orders := caA.issue(t, x509.Certificate{Subject: pkix.Name{CommonName: "orders"}})
	fromB := caB.issue(t, x509.Certificate{Subject: pkix.Name{CommonName: "payments"}})
	service := auth.Caller{Role: auth.RoleService, ID: "cert:orders"}
	check := func(what, header string, state *tls.ConnectionState, want auth.Caller) {
		t.Helper()
		for range 2 { // the second answer is the remembered one
			if got, err := a.AuthenticateTLS(header, state); err != nil || got != want {
				t.Errorf("AuthenticateTLS(%s) = %+v, %v, want %+v", what, got, err, want)
			}
		}
	}
	check("CA A's certificate", "", orders, service)
	check("no TLS", "", nil, auth.Anonymous)
	check("no certificate", "", &tls.ConnectionState{}, auth.Anonymous)
	check("CA B's certificate", "", fromB, auth.Anonymous)
	check("expired", "", caA.issue(t, x509.Certificate{Subject: pkix.Name{CommonName: "old"},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Minute)}), auth.Anonymous)
	check("for servers only", "", caA.issue(t, x509.Certificate{Subject: pkix.Name{CommonName: "web"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}), auth.Anonymous)
	check("admin token and certificate", "Bearer "+adminToken, orders, auth.Caller{Role: auth.RoleAdmin, ID: auth.TokenID(adminToken)})
	check("public token and certificate", "Bearer public-token-0123456789", orders, service)
	if got, err := a.AuthenticateTLS("Bearer unknown-token-0123456789", orders); !errors.Is(err, auth.ErrRefused) {
		t.Errorf("AuthenticateTLS(unknown token and certificate) = %+v, %v, want ErrRefused", got, err)
	}

	pool.Store(caB.pool) // the CA file rotated to B
	check("CA A's certificate after the rotation", "", orders, auth.Anonymous)
	check("CA B's certificate after the rotation", "", fromB, auth.Caller{Role: auth.RoleService, ID: "cert:payments"})

	noCAs, err := auth.New(t.Context(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := noCAs.AuthenticateTLS("", fromB); err != nil || got != auth.Anonymous {
		t.Errorf("AuthenticateTLS without client CAs = %+v, %v, want anonymous", got, err)
	}
}

// TestCertID: the common name, else the first SAN, else a fingerprint
// when no name is printable.
func TestCertID(t *testing.T) {
	ca := newTestCA(t)
	for _, tc := range []struct {
		tmpl x509.Certificate
		want string
	}{
		{x509.Certificate{Subject: pkix.Name{CommonName: "orders"}, DNSNames: []string{"orders.shop.svc"}}, "cert:orders"},
		{x509.Certificate{DNSNames: []string{"orders.shop.svc"}}, "cert:orders.shop.svc"},
		{x509.Certificate{Subject: pkix.Name{CommonName: "two words"}, EmailAddresses: []string{"ops@shop.example"}}, "cert:ops@shop.example"},
		{x509.Certificate{Subject: pkix.Name{CommonName: strings.Repeat("x", 129)}}, "cert:sha256:"},
	} {
		got := auth.CertID(ca.issue(t, tc.tmpl).PeerCertificates[0])
		if got != tc.want && !(strings.HasSuffix(tc.want, ":") && strings.HasPrefix(got, tc.want) && len(got) == len(tc.want)+12) {
			t.Errorf("CertID(%v) = %q, want %q", tc.tmpl.Subject, got, tc.want)
		}
	}
}
