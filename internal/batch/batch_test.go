package batch

import "testing"

func TestFill(t *testing.T) {
	ch := make(chan int, 10)
	if got := Fill(0, ch, 5); len(got) != 1 || got[0] != 0 {
		t.Errorf("Fill with nothing queued = %v, want [0]", got)
	}
	for i := 1; i <= 7; i++ {
		ch <- i
	}
	if got := Fill(0, ch, 5); len(got) != 5 || got[0] != 0 || got[4] != 4 {
		t.Errorf("Fill with 7 queued, cap 5 = %v, want [0 1 2 3 4]", got)
	}
	if got := Fill(9, ch, 5); len(got) != 4 || got[0] != 9 || got[1] != 5 || got[3] != 7 {
		t.Errorf("Fill with the 3 left = %v, want [9 5 6 7]", got)
	}
	if got := Fill(0, ch, 1); len(got) != 1 {
		t.Errorf("Fill with cap 1 = %v, want the first only", got)
	}
}
