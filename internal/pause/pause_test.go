package pause

import (
	"context"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	t.Run("Passes", func(t *testing.T) {
		if !For(context.Background(), time.Millisecond) {
			t.Fatalf("For(background, 1ms) = false, want true")
		}
	})
	t.Run("Ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		// An hour: only the ended context can make it return.
		if For(ctx, time.Hour) {
			t.Fatalf("For(cancelled, 1h) = true, want false")
		}
	})
}
