package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownTimeout bounds a graceful stop.
const shutdownTimeout = 10 * time.Second

// MuxConfig says what a process serves besides its Connect handlers.
type MuxConfig struct {
	// Services are the fully-qualified names for health and reflection
	// (which lists grpc.health.v1.Health besides them).
	Services []string
	// Ready reports readiness for /readyz and gRPC health; nil: always.
	Ready func() bool
	// Reason, if set, says why the process is not ready, in /readyz's
	// answer (the status code is the contract; the text is for people).
	Reason   func() string
	Gatherer prometheus.Gatherer
	// Pprof serves net/http/pprof under /debug/pprof/ (off by default:
	// profiles show internals).
	Pprof bool
}

// NewMux returns a mux with gRPC health, server reflection, /healthz,
// /readyz and /metrics; the caller adds its handlers.
func NewMux(cfg MuxConfig) *http.ServeMux {
	mux := http.NewServeMux()
	ready := cfg.Ready
	if ready == nil {
		ready = func() bool { return true }
	}
	mux.Handle(grpchealth.NewHandler(healthChecker{services: cfg.Services, ready: ready}))
	// Reflection lists the health service too, so that grpcurl lists it
	// and can call it by name.
	listed := append([]string{grpchealth.HealthV1ServiceName}, cfg.Services...)
	reflector := grpcreflect.NewStaticReflector(listed...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			msg := "not ready"
			if cfg.Reason != nil {
				if why := cfg.Reason(); why != "" {
					msg += ": " + why
				}
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if cfg.Gatherer != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

// NewOperatorMux returns the mux of an operator listener, apart from the
// public API: /healthz, /readyz (ready; nil: always), /metrics of gatherer
// and, with pprof, /debug/pprof/. Profiles and metrics show internals: they
// are never on the public port.
func NewOperatorMux(gatherer prometheus.Gatherer, pprof bool, ready func() bool) *http.ServeMux {
	return NewMux(MuxConfig{Gatherer: gatherer, Pprof: pprof, Ready: ready})
}

// healthChecker answers gRPC health from the readiness function.
type healthChecker struct {
	services []string
	ready    func() bool
}

func (h healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	known := req.Service == ""
	for _, s := range h.services {
		known = known || s == req.Service
	}
	if !known {
		return nil, grpchealthNotFound(req.Service)
	}
	if h.ready() {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
}

func grpchealthNotFound(service string) error {
	return connect.NewError(connect.CodeNotFound, errors.New("unknown service "+service))
}

// Serve serves h on lis until ctx ends, then shuts down gracefully within
// shutdownTimeout.
func Serve(ctx context.Context, lis net.Listener, h http.Handler) error {
	return ServeTLS(ctx, lis, h, nil)
}

// ServeTLS is Serve over TLS with cfg: HTTP/1.1 and HTTP/2, chosen by ALPN
// (gRPC, Connect and gRPC-Web clients all speak one of them). A nil cfg is
// Serve: cleartext HTTP/1.1 and h2c.
func ServeTLS(ctx context.Context, lis net.Listener, h http.Handler, cfg *tls.Config) error {
	srv := NewServer(h)
	errc := make(chan error, 1)
	if cfg != nil {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetHTTP2(true)
		srv.Protocols = &p
		srv.TLSConfig = cfg.Clone()
		go func() { errc <- srv.ServeTLS(lis, "", "") }()
	} else {
		go func() { errc <- srv.Serve(lis) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
