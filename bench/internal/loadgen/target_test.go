package loadgen_test

import (
	"testing"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/stock"
)

// TestOutcome_Definite checks that an answer is classified by the domain's
// own codes: every code that says the request changed nothing is definite,
// the newer ones too, and no transport code is.
func TestOutcome_Definite(t *testing.T) {
	for _, tc := range []struct {
		o    loadgen.Outcome
		want bool
	}{
		{loadgen.OK, true},
		{loadgen.OutOfStock, true},
		{loadgen.Error(string(stock.CodeIdempotencyKeyReused)), true},
		{loadgen.Error(string(stock.CodeMoveFenced)), true},
		{loadgen.Error(string(stock.CodeShardsRetiring)), true},
		{loadgen.Error(string(stock.CodePlacementFull)), true},
		{loadgen.Error(string(stock.CodeUnimplemented)), true},
		{loadgen.Error(string(stock.CodeInternal)), false},
		{loadgen.Error(string(stock.CodeShardUnavailable)), false},
		{loadgen.Error(loadgen.CodeUnavailable), false},
		{loadgen.Error(loadgen.CodeAbandoned), false},
	} {
		if got := tc.o.Definite(); got != tc.want {
			t.Errorf("%v.Definite() = %v, want %v", tc.o, got, tc.want)
		}
	}
}
