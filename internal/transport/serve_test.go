package transport

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
)

// TestNewMux_Reflection lists the services through gRPC server reflection,
// as grpcurl does, over a real h2c connection.
func TestNewMux_Reflection(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := make(chan error, 1)
	serveCtx, stop := context.WithCancel(ctx)
	go func() {
		served <- Serve(serveCtx, lis, NewMux(MuxConfig{Services: []string{shardstockv1connect.InventoryServiceName}}))
	}()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})

	stream := grpcreflect.NewClient(NewClient(), "http://"+lis.Addr().String()).NewStream(ctx)
	defer stream.Close()
	got, err := stream.ListServices()
	if err != nil {
		t.Fatalf("ListServices() = %v", err)
	}
	for _, want := range []protoreflect.FullName{grpchealth.HealthV1ServiceName, shardstockv1connect.InventoryServiceName} {
		if !slices.Contains(got, want) {
			t.Errorf("ListServices() = %v, want it to contain %s", got, want)
		}
		// grpcurl describes and calls a listed service through the file
		// that declares it.
		if files, err := stream.FileContainingSymbol(want); err != nil || len(files) == 0 {
			t.Errorf("FileContainingSymbol(%s) = %d files, %v; want its file", want, len(files), err)
		}
	}
}
