package allocatorcmd

import (
	"net/http/httptest"
	"testing"

	"github.com/shardstock/shardstock/gen/shardstock/v1/shardstockv1connect"
)

// TestWarmCall: the InventoryService's calls go to kept goroutines; its
// watches, which last as long as their clients want, and the other
// paths do not.
func TestWarmCall(t *testing.T) {
	for path, want := range map[string]bool{
		shardstockv1connect.InventoryServiceDeductProcedure:       true,
		shardstockv1connect.InventoryServiceReserveProcedure:      true,
		shardstockv1connect.InventoryServiceRequestTokenProcedure: true,
		shardstockv1connect.InventoryServiceWatchStockProcedure:   false,
		shardstockv1connect.InventoryServiceWatchTicketProcedure:  false,
		shardstockv1connect.AdminServiceWatchLedgerProcedure:      false,
		shardstockv1connect.AdminServiceGetTopologyProcedure:      false,
		"/grpc.health.v1.Health/Watch":                            false,
		"/":                                                       false,
	} {
		if got := warmCall(httptest.NewRequest("POST", path, nil)); got != want {
			t.Errorf("warmCall(%s) = %v, want %v", path, got, want)
		}
	}
}
