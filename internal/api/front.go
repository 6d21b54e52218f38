package api

import (
	"net/http"

	"connectrpc.com/connect"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
	"github.com/shardstock/shardstock/internal/transport"
)

// InventoryFront is the InventoryService as a public listener serves it:
// the handler with the public options and metrics' interceptor, behind
// admission (Admit: admit, refusals counted in metrics), its calls on
// kept goroutines (transport.Warm). It returns the service's path, the
// fronted handler, and the bare one, for the streaming procedures that
// take admission without a kept goroutine (WatchWriter). The allocator
// serves it, and so does the load generator's Connect-fronted Redis, so
// that the two are measured behind one front.
func InventoryFront(inv *InventoryHandler, admit AdmitConfig, metrics *transport.Metrics) (path string, fronted, bare http.Handler) {
	path, bare = shardstockv1connect.NewInventoryServiceHandler(inv,
		append(transport.PublicHandlerOptions(), connect.WithInterceptors(metrics))...)
	return path, Admit(admit, transport.Warm(bare, 0), metrics.Refused), bare
}
