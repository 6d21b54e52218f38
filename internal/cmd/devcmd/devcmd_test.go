package devcmd

import (
	"slices"
	"testing"
)

func TestShareCores(t *testing.T) {
	base := []string{"PATH=/bin", "HOME=/root"}
	for _, c := range []struct {
		name        string
		env         []string
		procs, cpus int
		want        string // the GOMAXPROCS entry added; "": none
	}{
		{"make run on two cores: one each", base, 4, 2, "GOMAXPROCS=1"},
		{"make run on sixteen cores", base, 4, 16, "GOMAXPROCS=4"},
		{"a share rounds down", base, 4, 7, "GOMAXPROCS=1"},
		{"one process has every core", base, 1, 8, "GOMAXPROCS=8"},
		{"no process at all is one", base, 0, 8, "GOMAXPROCS=8"},
		{"the caller's own setting wins", append(slices.Clone(base), "GOMAXPROCS=3"), 4, 2, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := shareCores(slices.Clone(c.env), c.procs, c.cpus)
			want := slices.Clone(c.env)
			if c.want != "" {
				want = append(want, c.want)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("shareCores(%v, %d, %d) = %v, want %v", c.env, c.procs, c.cpus, got, want)
			}
		})
	}
}
