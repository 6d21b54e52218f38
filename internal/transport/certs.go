package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// certCheckInterval is how often, at most, the certificate, key and CA
// files are looked at again (a stat of each, at the next handshake after
// the interval; nothing is read unless one changed). cert-manager renews a
// certificate at two thirds of its life and the kubelet takes up to a
// minute or more to update a mounted Secret, so a few seconds more are
// nothing; an idle process stats nothing at all.
const certCheckInterval = 5 * time.Second

// CertFiles are PEM files re-read when they change, without a restart and
// without closing a connection: the certificate and key a process presents
// and the CA it verifies its peers with. A pair read half-written (the
// certificate new, the key old) or a CA file that does not parse is not
// taken: the last good files stay in use, the failure is logged once and
// reading is tried again at every check until it succeeds.
type CertFiles struct {
	cert, key, ca string // a file name; "" for none
	interval      time.Duration
	log           *slog.Logger

	pair atomic.Pointer[tls.Certificate] // nil without cert
	pool atomic.Pointer[x509.CertPool]   // nil without ca
	// server is the config of a handshake with the current client CA,
	// handed out by GetConfigForClient (rebuilt on each reload only).
	server atomic.Pointer[tls.Config]

	next    atomic.Int64  // unix nanoseconds: no check before
	mu      sync.Mutex    // one check at a time; handshakes meanwhile use the current files
	seen    []os.FileInfo // of cert, key, ca as last read; nil entries for none
	failing bool          // the last read failed: logged, retry at each check
}

// ServerTLS is the TLS of a server that presents certFile/keyFile. With
// caFile, a client certificate is verified against it when given
// (tls.VerifyClientCertIfGiven: RequireClientCert refuses calls without
// one, probes stay open). All three follow their files.
func ServerTLS(certFile, keyFile, caFile string, log *slog.Logger) (*tls.Config, error) {
	f, err := newCertFiles(certFile, keyFile, caFile, certCheckInterval, log)
	if err != nil {
		return nil, err
	}
	return f.serverConfig(), nil
}

// ClientTLS are the files of a client that presents certFile/keyFile and
// trusts the certificates of caFile, all three followed (ClientConfig).
func ClientTLS(certFile, keyFile, caFile string, log *slog.Logger) (*CertFiles, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("transport: TLS: a client needs a certificate, its key and a CA file")
	}
	return newCertFiles(certFile, keyFile, caFile, certCheckInterval, log)
}

// newCertFiles reads the files once: at start, a bad file is an error.
func newCertFiles(cert, key, ca string, interval time.Duration, log *slog.Logger) (*CertFiles, error) {
	if log == nil {
		log = slog.Default()
	}
	f := &CertFiles{cert: cert, key: key, ca: ca, interval: interval, log: log}
	seen, err := f.stat()
	if err != nil {
		return nil, err
	}
	if err := f.load(); err != nil {
		return nil, err
	}
	f.seen = seen
	f.next.Store(time.Now().Add(interval).UnixNano())
	return f, nil
}

// files are the names of the files, in the order of seen.
func (f *CertFiles) files() []string { return []string{f.cert, f.key, f.ca} }

// stat looks at every file.
func (f *CertFiles) stat() ([]os.FileInfo, error) {
	infos := make([]os.FileInfo, 3)
	for i, name := range f.files() {
		if name == "" {
			continue
		}
		info, err := os.Stat(name) // follows the symlinks of a mounted Secret
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		infos[i] = info
	}
	return infos, nil
}

// changed says whether a file is another one (a mounted Secret's files are
// swapped by a symlink) or was written since seen.
func changed(seen, now []os.FileInfo) bool {
	for i := range now {
		a, b := seen[i], now[i]
		if a == nil || b == nil {
			if a != b {
				return true
			}
			continue
		}
		if !os.SameFile(a, b) || !a.ModTime().Equal(b.ModTime()) || a.Size() != b.Size() {
			return true
		}
	}
	return false
}

// load reads every file and takes them all, or none.
func (f *CertFiles) load() error {
	var pair *tls.Certificate
	if f.cert != "" {
		p, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return fmt.Errorf("TLS certificate %s, key %s: %w", f.cert, f.key, err)
		}
		pair = &p
	}
	var pool *x509.CertPool
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return fmt.Errorf("CA: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("CA %s: no certificate in it", f.ca)
		}
	}
	f.pair.Store(pair)
	f.pool.Store(pool)
	if pool != nil {
		// Replaces the server's own config in the handshake (see
		// serverConfig), so it names the protocols ServeTLS offers.
		// No session tickets: a resumed session keeps the client
		// certificate verified before, past a change of CA.
		f.server.Store(&tls.Config{GetCertificate: f.getCertificate, MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2", "http/1.1"}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven,
			SessionTicketsDisabled: true})
	}
	return nil
}

// refresh reads the files again if the interval has passed since the last
// check and one of them changed (or the last read failed).
func (f *CertFiles) refresh() {
	if time.Now().UnixNano() < f.next.Load() || !f.mu.TryLock() {
		return
	}
	defer f.mu.Unlock()
	if time.Now().UnixNano() < f.next.Load() {
		return // checked while this one waited for the lock
	}
	f.next.Store(time.Now().Add(f.interval).UnixNano())
	now, err := f.stat()
	if err == nil {
		if !f.failing && !changed(f.seen, now) {
			return
		}
		err = f.load()
	}
	if err != nil {
		if !f.failing {
			f.log.Warn("TLS files not reloaded: still serving the last good ones, retrying", "err", err, "retry", f.interval)
		}
		f.failing = true
		return
	}
	if f.failing {
		f.log.Info("TLS files reloaded after a failure")
	} else {
		f.log.Info("TLS files reloaded", "cert", f.cert, "ca", f.ca)
	}
	f.seen, f.failing = now, false
}

// certificate is the current pair, after a check.
func (f *CertFiles) certificate() *tls.Certificate {
	f.refresh()
	return f.pair.Load()
}

// getCertificate is tls.Config.GetCertificate: the current pair.
func (f *CertFiles) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return f.certificate(), nil
}

// serverConfig is the config of a server with f's files.
func (f *CertFiles) serverConfig() *tls.Config {
	cfg := &tls.Config{GetCertificate: f.getCertificate, MinVersion: tls.VersionTLS12}
	if f.ca == "" {
		return cfg
	}
	// The client CA is fixed in a tls.Config, so each handshake gets the
	// config that load built with the current pool.
	cfg.ClientCAs, cfg.ClientAuth, cfg.SessionTicketsDisabled = f.pool.Load(), tls.VerifyClientCertIfGiven, true
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		f.refresh()
		return f.server.Load(), nil
	}
	return cfg
}

// ClientConfig is the TLS config of a new connection to serverName (a host
// name or address): the current certificate to present and the current CA
// to verify the server with (a tls.Config's RootCAs is fixed, so each
// connection gets its own; NewInternalTLSClient dials with it).
func (f *CertFiles) ClientConfig(serverName string) *tls.Config {
	f.refresh()
	pair := f.pair.Load()
	return &tls.Config{
		ServerName: serverName,
		RootCAs:    f.pool.Load(),
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return pair, nil
		},
	}
}

// ClientCAFile is a CA file that verifies client certificates outside the
// handshake (Pool), followed like the other files: a handshake cannot
// fall back to another credential when a certificate does not verify, so
// the listener only requests one (RequestClientCerts) and the caller
// checks it against Pool.
func ClientCAFile(caFile string, log *slog.Logger) (*CertFiles, error) {
	if caFile == "" {
		return nil, errors.New("transport: TLS: no client CA file")
	}
	return newCertFiles("", "", caFile, certCheckInterval, log)
}

// Pool is the current CA pool, after a check of the files; nil without a
// CA file.
func (f *CertFiles) Pool() *x509.CertPool {
	f.refresh()
	return f.pool.Load()
}

// RequestClientCerts returns a copy of a server's cfg that asks every
// client for a certificate and takes any, or none, without verifying it:
// whoever serves the connection verifies it (against a ClientCAFile's
// Pool) and treats one that does not verify as no certificate. Session
// tickets are off, so that a resumed session cannot carry a certificate
// past its connection.
func RequestClientCerts(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.ClientAuth, c.SessionTicketsDisabled = tls.RequestClientCert, true
	return c
}
