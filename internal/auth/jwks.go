package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
)

// Bounds of reading a JWKS.
const (
	// RefreshDefault is how often a JWKS is read again: a key the issuer
	// adds is taken at once (an unknown key id reads it again), one it
	// removes is refused within this long.
	RefreshDefault = time.Minute
	// reloadGap is the least time between two reads for an unknown key
	// id, so that tokens with made-up ids cannot make this process hammer
	// the issuer.
	reloadGap = time.Second
	// jwksBytesMax bounds a JWKS document.
	jwksBytesMax = 1 << 20
	// fetchTimeout bounds one read of a JWKS URL.
	fetchTimeout = 10 * time.Second
)

// keySet is a JWKS read from a file or a URL and read again while the
// process runs; the last good read serves until a newer one parses.
type keySet struct {
	source  string
	client  *http.Client
	log     *slog.Logger
	current atomic.Pointer[keyfunc.Keyfunc]

	mu    sync.Mutex // one read at a time
	raw   []byte     // of the last good read
	asked time.Time  // the last read for an unknown key id
}

// newKeySet reads cfg.JWKS once and starts reading it every cfg.Refresh
// until ctx ends.
func newKeySet(ctx context.Context, cfg Config) (*keySet, error) {
	k := &keySet{source: cfg.JWKS, client: cfg.Client, log: cfg.Logger}
	if k.client == nil {
		k.client = &http.Client{Timeout: fetchTimeout}
	}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	if err := k.reload(ctx); err != nil {
		return nil, err
	}
	refresh := cfg.Refresh
	if refresh <= 0 {
		refresh = RefreshDefault
	}
	go func() {
		t := time.NewTicker(refresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := k.reload(ctx); err != nil && ctx.Err() == nil {
					k.log.Warn("JWKS not read again; the last one read serves", "jwks", k.source, "err", err)
				}
			}
		}
	}()
	return k, nil
}

// reload reads the JWKS and, if it changed and parses, serves it.
func (k *keySet) reload(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	raw, err := k.read(ctx)
	if err != nil {
		return err
	}
	if k.current.Load() != nil && bytes.Equal(raw, k.raw) {
		return nil
	}
	kf, err := keyfunc.NewJWKSetJSON(raw)
	if err != nil {
		return fmt.Errorf("auth: JWKS %s: %w", k.source, err)
	}
	k.raw = raw
	k.current.Store(&kf)
	k.log.Info("JWKS read", "jwks", k.source, "keys", len(mustKeys(kf)))
	return nil
}

// mustKeys lists a key set's keys (none if it cannot).
func mustKeys(kf keyfunc.Keyfunc) []string {
	ks, err := kf.Storage().KeyReadAll(context.Background())
	if err != nil {
		return nil
	}
	ids := make([]string, len(ks))
	for i, jwk := range ks {
		ids[i] = jwk.Marshal().KID
	}
	return ids
}

// read returns the JWKS document.
func (k *keySet) read(ctx context.Context) ([]byte, error) {
	if !strings.HasPrefix(k.source, "https://") && !strings.HasPrefix(k.source, "http://") {
		f, err := os.Open(k.source)
		if err != nil {
			return nil, fmt.Errorf("auth: JWKS: %w", err)
		}
		defer f.Close()
		return readBounded(f)
	}
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.source, nil)
	if err != nil {
		return nil, fmt.Errorf("auth: JWKS: %w", err)
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("auth: JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("auth: JWKS %s: %s", k.source, resp.Status)
	}
	return readBounded(resp.Body)
}

// readBounded reads r whole, up to jwksBytesMax.
func readBounded(r io.Reader) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(r, jwksBytesMax+1))
	if err != nil {
		return nil, fmt.Errorf("auth: JWKS: %w", err)
	}
	if len(raw) > jwksBytesMax {
		return nil, fmt.Errorf("auth: JWKS larger than %d bytes", jwksBytesMax)
	}
	return raw, nil
}

// keyfunc finds a JWT's key. A key id the set does not hold reads the set
// again first (at most once per reloadGap): an issuer that adds a key
// signs with it at once.
func (k *keySet) keyfunc(t *jwt.Token) (any, error) {
	key, err := (*k.current.Load()).Keyfunc(t)
	if err == nil {
		return key, nil
	}
	k.mu.Lock()
	due := time.Since(k.asked) >= reloadGap
	if due {
		k.asked = time.Now()
	}
	k.mu.Unlock()
	if !due {
		return nil, err
	}
	if rerr := k.reload(context.Background()); rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	return (*k.current.Load()).Keyfunc(t)
}
