package stock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"testing"

	"github.com/shardstock/shardstock/internal/stock"
)

// TestCodes_Listed checks that every Code constant declared in error.go is
// in stock.Codes, so that Definite knows a new code.
func TestCodes_Listed(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "error.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit := v.(*ast.BasicLit)
				code := stock.Code(lit.Value[1 : len(lit.Value)-1])
				declared++
				if !slices.Contains(stock.Codes, code) {
					t.Errorf("stock.Codes lacks %s, declared in error.go", code)
				}
			}
		}
	}
	if declared != len(stock.Codes) {
		t.Errorf("error.go declares %d codes, stock.Codes lists %d", declared, len(stock.Codes))
	}
}

func TestCode_Definite(t *testing.T) {
	for _, tc := range []struct {
		code stock.Code
		want bool
	}{
		{stock.CodeOutOfStock, true},
		{stock.CodeIdempotencyKeyReused, true},
		{stock.CodeRateLimited, true}, // and Retryable
		{stock.CodeMoveFenced, true},
		{stock.CodeShardsRetiring, true},
		{stock.CodePlacementFull, true},
		{stock.CodeInternal, false},
		{stock.CodeShardUnavailable, false},
		{stock.CodeOperationInProgress, false},
		{"UNAVAILABLE", false}, // a transport's, not the API's
		{"", false},
	} {
		if got := tc.code.Definite(); got != tc.want {
			t.Errorf("Code(%q).Definite() = %v, want %v", tc.code, got, tc.want)
		}
	}
}
