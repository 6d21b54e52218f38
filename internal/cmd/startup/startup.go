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
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardstock/shardstock/internal/transport"
)

// Env returns getenv(name), or def when it is empty: a flag's default, so
// that a flag given on the command line wins over the environment.
func Env(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// EnvDefaults gives flags their defaults from the environment, so that
// each setting is read one way: a flag, its environment variable named
// beside it where it is defined, the command line winning over both. A
// value that does not parse is not dropped: Err reports it, naming the
// variable, and the flag keeps its built-in default meanwhile.
type EnvDefaults struct {
	getenv func(string) string
	errs   []error
}

// NewEnvDefaults reads the environment through getenv.
func NewEnvDefaults(getenv func(string) string) *EnvDefaults {
	return &EnvDefaults{getenv: getenv}
}

// String is variable's value, or def when it is empty.
func (e *EnvDefaults) String(variable, def string) string { return Env(e.getenv, variable, def) }

// Bool is variable's value as strconv.ParseBool reads it ("1", "0",
// "true", ...), or def when it is empty.
func (e *EnvDefaults) Bool(variable string, def bool) bool {
	return envValue(e, variable, def, strconv.ParseBool)
}

// Int is variable's value, or def when it is empty.
func (e *EnvDefaults) Int(variable string, def int) int {
	return envValue(e, variable, def, strconv.Atoi)
}

// Float64 is variable's value, or def when it is empty.
func (e *EnvDefaults) Float64(variable string, def float64) float64 {
	return envValue(e, variable, def, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
}

// Duration is variable's value, or def when it is empty.
func (e *EnvDefaults) Duration(variable string, def time.Duration) time.Duration {
	return envValue(e, variable, def, time.ParseDuration)
}

// Err reports every variable whose value did not parse.
func (e *EnvDefaults) Err() error { return errors.Join(e.errs...) }

func envValue[T any](e *EnvDefaults, variable string, def T, parse func(string) (T, error)) T {
	v := e.getenv(variable)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: %w", variable, v, err))
		return def
	}
	return x
}

// LogFormatUsage documents -log-format.
const LogFormatUsage = "log format: text or json (env SHARDSTOCK_LOG_FORMAT)"

// Logger returns a logger at level ("debug", "info", "warn", "error") in
// format ("text", or "json": one JSON object a line, for log collectors).
func Logger(w io.Writer, level, format string) (*slog.Logger, error) {
	h, err := logHandler(w, level, format)
	if err != nil {
		return nil, err
	}
	return slog.New(h), nil
}

// logHandler is Logger's handler.
func logHandler(w io.Writer, level, format string) (slog.Handler, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text", "":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
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
const TLSUsage = "PEM files of the certificate (with its chain) and key to serve TLS with on every listener of the process, re-read when they change; both or neither (env SHARDSTOCK_TLS_CERT, SHARDSTOCK_TLS_KEY)"

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
// The files are re-read when they change (transport.ServerTLS): a renewed
// certificate needs no restart; log says when they are, or cannot be.
func TLSConfig(certFile, keyFile, clientCA string, log *slog.Logger) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		if clientCA != "" {
			return nil, errors.New("a client CA needs -tls-cert and -tls-key")
		}
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	// A client certificate is verified when given; the services that need
	// one refuse calls without (transport.RequireClientCert), so probes
	// still work.
	return transport.ServerTLS(certFile, keyFile, clientCA, log)
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

// ClientTLSConfig are the files of a client that presents certFile/keyFile
// and trusts caFile's certificates (all empty: nil, cleartext), re-read
// when they change (transport.NewInternalTLSClient dials with them).
func ClientTLSConfig(certFile, keyFile, caFile string, log *slog.Logger) (*transport.CertFiles, error) {
	if certFile == "" && keyFile == "" && caFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("-shard-tls-cert, -shard-tls-key and -shard-tls-ca go together")
	}
	return transport.ClientTLS(certFile, keyFile, caFile, log)
}

// Stores is where a server command finds its databases and etcd: the
// settings cmd/allocator and cmd/shard both take.
type Stores struct {
	DatabaseURL, MoreDatabases, MigrateURL, MigrateDatabases string
	Etcd                                                     EtcdConfig
}

// Flags defines the settings of s on fs, each with its environment
// variable as its default.
func (s *Stores) Flags(fs *flag.FlagSet, env *EnvDefaults) {
	fs.StringVar(&s.DatabaseURL, "database-url", env.String("DATABASE_URL", ""), "Postgres URL of the database named main (env DATABASE_URL)")
	fs.StringVar(&s.MoreDatabases, "databases", env.String("SHARDSTOCK_DATABASES", ""), DatabasesUsage)
	fs.StringVar(&s.MigrateURL, "migrate-url", env.String("SHARDSTOCK_MIGRATE_URL", ""), MigrateUsage)
	fs.StringVar(&s.MigrateDatabases, "migrate-databases", env.String("SHARDSTOCK_MIGRATE_DATABASES", ""), MigrateDatabasesUsage)
	fs.StringVar(&s.Etcd.Endpoints, "etcd-endpoints", env.String("ETCD_ENDPOINTS", ""), "comma-separated etcd endpoints (env ETCD_ENDPOINTS)")
	fs.StringVar(&s.Etcd.CA, "etcd-ca", env.String("ETCD_CACERT", ""), EtcdTLSUsage)
	fs.StringVar(&s.Etcd.Cert, "etcd-cert", env.String("ETCD_CERT", ""), "see -etcd-ca")
	fs.StringVar(&s.Etcd.Key, "etcd-key", env.String("ETCD_KEY", ""), "see -etcd-ca")
}
