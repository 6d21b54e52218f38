// Package startup is what shardstock's commands do as they start: configuration from flags
// over environment over defaults, logging, and listening.
package startup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Env returns getenv(name), or def when it is empty: a flag's default, so
// that a flag given on the command line wins over the environment.
func Env(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// FlagsFromEnv sets each flag of fs named in env that the command line did
// not set from the environment variable env names, if that is set: the
// same parsing and checks as on the command line, so a bad value is an
// error that names the variable. Call it after fs.Parse.
func FlagsFromEnv(fs *flag.FlagSet, getenv func(string) string, env map[string]string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, variable := range env {
		v := getenv(variable)
		if given[name] || v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("%s=%q (for -%s): %w", variable, v, name, err)
		}
	}
	return nil
}

// LogFormatUsage documents -log-format.
const LogFormatUsage = "log format: text or json (env SHARDSTOCK_LOG_FORMAT)"

// Logger returns a logger at level ("debug", "info", "warn", "error") in
// format ("text", or "json": one JSON object a line, for log collectors).
func Logger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

// Listen listens on addr (host:port; port 0 picks one).
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}

// etcdDialTimeout bounds connecting to etcd.
const etcdDialTimeout = 5 * time.Second

// Etcd connects to comma-separated etcd endpoints.
func Etcd(endpoints string) (*clientv3.Client, error) {
	return EtcdTLS(EtcdConfig{Endpoints: endpoints})
}

// EtcdConfig is how a process reaches etcd.
type EtcdConfig struct {
	Endpoints string // comma-separated
	// CA, Cert and Key are PEM files: the CA of the etcd servers'
	// certificates (TLS, with https:// endpoints), and this process's own
	// certificate and key when etcd requires one (--client-cert-auth).
	CA, Cert, Key string
}

// EtcdTLSUsage documents -etcd-ca, -etcd-cert and -etcd-key.
const EtcdTLSUsage = "PEM files for TLS to etcd (https:// endpoints): the CA of its servers' certificates, and this process's certificate and key if etcd requires one (env ETCD_CACERT, ETCD_CERT, ETCD_KEY)"

// EtcdTLS connects to etcd as cfg says.
func EtcdTLS(cfg EtcdConfig) (*clientv3.Client, error) {
	eps := strings.Split(cfg.Endpoints, ",")
	if cfg.Endpoints == "" || len(eps) == 0 {
		return nil, fmt.Errorf("no etcd endpoints: set -etcd-endpoints or ETCD_ENDPOINTS")
	}
	cc := clientv3.Config{Endpoints: eps, DialTimeout: etcdDialTimeout, Logger: nopLogger()}
	if cfg.CA != "" {
		pool, err := CertPool(cfg.CA)
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		cc.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if cfg.Cert != "" || cfg.Key != "" {
			cert, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
			if err != nil {
				return nil, fmt.Errorf("etcd client certificate: %w", err)
			}
			cc.TLS.Certificates = []tls.Certificate{cert}
		}
	} else if cfg.Cert != "" || cfg.Key != "" {
		return nil, errors.New("-etcd-cert and -etcd-key need -etcd-ca")
	}
	c, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", cfg.Endpoints, err)
	}
	return c, nil
}

// TLSUsage documents -tls-cert and -tls-key.
const TLSUsage = "PEM files of the certificate (with its chain) and key to serve TLS with on every listener of the process; both or neither (env SHARDSTOCK_TLS_CERT, SHARDSTOCK_TLS_KEY)"

// Scheme is the URL scheme of a listener served with cfg: https, or http
// without TLS (nil).
func Scheme(cfg *tls.Config) string {
	if cfg == nil {
		return "http"
	}
	return "https"
}

// TLSConfig loads a server certificate and key (both empty: nil, no TLS).
// With clientCA, clients must present a certificate that CA signed (mTLS).
func TLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		if clientCA != "" {
			return nil, errors.New("a client CA needs -tls-cert and -tls-key")
		}
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pool, err := CertPool(clientCA)
		if err != nil {
			return nil, err
		}
		// Verified when given; the services that need one refuse calls
		// without (transport.RequireClientCert), so probes still work.
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// CertPool reads the PEM certificates of file.
func CertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA %s: no certificate in it", file)
	}
	return pool, nil
}

// ClientTLSConfig is the TLS of a client that presents certFile/keyFile and
// trusts caFile's certificates (all empty: nil, cleartext).
func ClientTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && caFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("-shard-tls-cert, -shard-tls-key and -shard-tls-ca go together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	pool, err := CertPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
