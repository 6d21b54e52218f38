package loadgen

import "context"

type abandonKey struct{}

// withAbandon returns a context that the runner means to abandon: cancel
// fires when the target calls Sent, or when the runner's timer fires first.
func withAbandon(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	return context.WithValue(ctx, abandonKey{}, cancel), cancel
}

// Sent tells the runner that the request carried by ctx has left the client.
// When the runner means to abandon that request (the abandon fault mode), Sent
// cancels ctx at once, as a client that gives up right after sending would;
// otherwise it does nothing. Targets that can tell when a request is on the
// wire (an HTTP client's WroteRequest trace hook) call it there; the runner
// also cancels after a short random delay, for targets that cannot.
func Sent(ctx context.Context) {
	if cancel, ok := ctx.Value(abandonKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

// Abandoning reports whether the runner will abandon the request carried by
// ctx, so that a target installs its Sent hook only when needed.
func Abandoning(ctx context.Context) bool {
	_, ok := ctx.Value(abandonKey{}).(context.CancelFunc)
	return ok
}
