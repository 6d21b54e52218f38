package api

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
	"github.com/shardstock/shardstock/internal/stock"
	"github.com/shardstock/shardstock/internal/wire"
)

// Limit's in-flight bound refuses at once, with RATE_LIMITED, the calls
// beyond it while the others are being served, and admits again once they
// end.
func TestLimit_InFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	served := Limit(LimitConfig{InFlight: 2})(func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		entered <- struct{}{}
		<-release
		return nil, nil
	})
	ctx := context.Background()
	req := func() connect.AnyRequest { return connect.NewRequest(&v1.GetStockRequest{Sku: "s"}) }
	done := make(chan error, 2)
	for range 2 {
		go func() { _, err := served(ctx, req()); done <- err }()
		<-entered
	}
	if _, err := served(ctx, req()); wire.Reason(err) != string(stock.CodeRateLimited) || connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("third call while two are served = %v, want RATE_LIMITED", err)
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := served(ctx, req()); err != nil {
		t.Fatalf("a call after the others ended = %v, want admitted", err)
	}
}

// TokenAuth admits only the exact bearer token.
func TestTokenAuth(t *testing.T) {
	served := TokenAuth("API token", "the-token-0123456789", "")(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, nil })
	for hdr, ok := range map[string]bool{"": false, "Bearer the-token-0123456789": true, "Bearer the-token-012345678": false,
		"bearer the-token-0123456789": false, "Bearer the-token-0123456789 ": false, "Basic the-token-0123456789": false} {
		req := connect.NewRequest(&v1.GetStockRequest{Sku: "s"})
		if hdr != "" {
			req.Header().Set("Authorization", hdr)
		}
		_, err := served(context.Background(), req)
		if (err == nil) != ok || (err != nil && connect.CodeOf(err) != connect.CodeUnauthenticated) {
			t.Errorf("Authorization %q: %v, want admitted %v", hdr, err, ok)
		}
	}
}
