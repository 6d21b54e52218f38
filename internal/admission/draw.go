package admission

import (
	"math/rand/v2"
	"slices"
)

// DrawSeedLen is the length of a draw's seed: a ChaCha8 key.
const DrawSeedLen = 32

// DrawOrder is a draw's order: the tickets shuffled by a Fisher-Yates
// shuffle driven by ChaCha8 keyed with seed. The ids are taken in sorted
// (byte) order first, so the order depends on the seed and the set of ids
// alone, not on the order a database returned them in: the worker that
// runs the draw and anyone replaying it from GetDraw's seed and list get
// the same order. ChaCha8 is part of Go's compatibility promise
// (math/rand/v2 fixes its output stream), so the replay holds across Go
// releases.
func DrawOrder(seed [DrawSeedLen]byte, ticketIDs []string) []string {
	order := slices.Clone(ticketIDs)
	slices.Sort(order)
	r := rand.New(rand.NewChaCha8(seed))
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	return order
}
