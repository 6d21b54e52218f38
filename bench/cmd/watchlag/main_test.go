package main

import (
	"strings"
	"testing"
	"time"
)

// TestLags: an entry's line is its receipt time and its age then; a
// progress message has none; a line that is not a message is an error.
func TestLags(t *testing.T) {
	at := time.Date(2026, 12, 5, 14, 0, 1, 250_000_000, time.UTC)
	now := func() time.Time { return at }
	in := `{"database":"main","entry":{"id":"7","createdAt":"2026-12-05T14:00:01Z"},"cursor":"c1.a"}
{"cursor":"c1.b"}
{"database":"main","entry":{"id":"8","createdAt":"2026-12-05T14:00:00.750Z"},"cursor":"c1.c"}
`
	var out strings.Builder
	if err := lags(strings.NewReader(in), &out, now); err != nil {
		t.Fatalf("lags = %v", err)
	}
	want := "1796479201.250000 0.250000\n1796479201.250000 0.500000\n"
	if out.String() != want {
		t.Errorf("lags wrote %q, want %q", out.String(), want)
	}
	if err := lags(strings.NewReader("stockctl: unavailable\n"), &out, now); err == nil {
		t.Error("lags of a line that is not a message = nil, want an error")
	}
}
