package stock

import (
	"fmt"
	"testing"
)

func TestPlacement_SingleHasOneCandidate(t *testing.T) {
	p := SinglePlacement("main")
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		sku := fmt.Sprintf("sku-%d", i)
		if c := p.Candidates(sku); len(c) != 1 || c[0] != "main" || p.Newest(sku) != "main" {
			t.Fatalf("Candidates(%s) = %v, Newest %s", sku, c, p.Newest(sku))
		}
	}
}

// TestPlacement_NextMovesNoExistingSKU: adding a database sends new SKUs
// of about a third of the slots to it, and every SKU placed before is still
// among its candidates, in the database it was placed in.
func TestPlacement_NextMovesNoExistingSKU(t *testing.T) {
	p1, err := Placement{}.Next([]string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := p1.Next([]string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Check(); err != nil {
		t.Fatal(err)
	}
	counts := p2.SlotCounts()
	if counts["a"] != 342 || counts["b"] != 341 || counts["c"] != 341 {
		t.Errorf("slot counts %v, want 342/341/341", counts)
	}
	changed := 0
	for i := range 5000 {
		sku := fmt.Sprintf("sku-%d", i)
		was := p1.Newest(sku)
		c := p2.Candidates(sku)
		if c[0] != p2.Newest(sku) {
			t.Fatalf("%s: first candidate %s, newest %s", sku, c[0], p2.Newest(sku))
		}
		if c[len(c)-1] != was {
			t.Fatalf("%s: candidates %v do not end with its first database %s", sku, c, was)
		}
		if len(c) > 1 {
			changed++
			if c[0] != "c" {
				t.Fatalf("%s moved from %s to %s: only slots going to the new database should change", sku, was, c[0])
			}
		}
	}
	// About a third of the SKUs have a second candidate (their slot went to c).
	if changed < 1400 || changed > 1950 {
		t.Errorf("%d of 5000 SKUs have two candidates, want about 1667", changed)
	}
	if got := p2.Databases(); fmt.Sprint(got) != "[a b c]" {
		t.Errorf("Databases() = %v", got)
	}
}

func TestPlacement_Bounds(t *testing.T) {
	p := SinglePlacement("main")
	var err error
	for i := 1; i < PlacementVersionsMax; i++ {
		if p, err = p.Next([]string{"main", fmt.Sprintf("d%d", i)}); err != nil {
			t.Fatalf("version %d: %v", i+1, err)
		}
	}
	if _, err := p.Next([]string{"main"}); CodeOf(err) != CodePlacementFull {
		t.Errorf("version %d: err %v, want PLACEMENT_FULL", PlacementVersionsMax+1, err)
	}
	for _, bad := range [][]string{nil, {""}, {"a", "a"}, {"Main"}, {"a b"}, {"x123456789012345678901234567890123"}} {
		if _, err := SinglePlacement("main").Next(bad); CodeOf(err) != CodeInvalidArgument {
			t.Errorf("Next(%q) = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}
