package stock_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

func TestErrResult(t *testing.T) {
	fallback := stock.Errorf(stock.CodeShardUnavailable, "retry")
	oos := stock.Errorf(stock.CodeOutOfStock, "none left")
	for _, tc := range []struct {
		name string
		err  error
		want *stock.Error
	}{
		{"Error", oos, oos},
		{"Wrapped", fmt.Errorf("batch: %w", oos), oos},
		{"Other", errors.New("connection reset"), fallback},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stock.ErrResult(tc.err, fallback); got.Err != tc.want {
				t.Errorf("ErrResult(%v) = %v, want %v", tc.err, got.Err, tc.want)
			}
		})
	}
}
