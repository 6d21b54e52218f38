package drop

import (
	"fmt"
	"strings"
	"testing"
)

// The requests after the sell-out are cut into slices that cover each
// side's requests once, in order, and take turns: s c, c s, s c, ... (c s
// first with swap).
func TestAfterTurns(t *testing.T) {
	for _, tc := range []struct {
		n, rounds int
		swap      bool
		want      string
	}{
		{10, 1, false, "s0-10 c0-10"},
		{10, 1, true, "c0-10 s0-10"},
		{10, 3, false, "s0-3 c0-3 c3-6 s3-6 s6-10 c6-10"},
		{10, 3, true, "c0-3 s0-3 s3-6 c3-6 c6-10 s6-10"},
		{7, 7, false, "s0-1 c0-1 c1-2 s1-2 s2-3 c2-3 c3-4 s3-4 s4-5 c4-5 c5-6 s5-6 s6-7 c6-7"},
	} {
		var got []string
		for _, tu := range afterTurns(tc.n, tc.rounds, tc.swap) {
			side := "s"
			if tu.ceiling {
				side = "c"
			}
			got = append(got, fmt.Sprintf("%s%d-%d", side, tu.from, tu.to))
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("afterTurns(%d, %d, %v) = %s, want %s", tc.n, tc.rounds, tc.swap, g, tc.want)
		}
	}
}
