package admission

import (
	"context"
	"crypto/rand"
	mrand "math/rand/v2"
	"slices"

	"github.com/shardstock/shardstock/internal/stock"
)

// DrawSeedLen is the length of a draw's seed: a ChaCha8 key.
const DrawSeedLen = 32

// DrawOrder is a draw's order: the tickets shuffled by a Fisher-Yates
// shuffle driven by ChaCha8 keyed with seed. The ids are taken in sorted
// (byte) order first, so the order depends on the seed and the set of ids
// alone, not on the order a database returned them in: the worker that
// runs the draw and anyone replaying it from GetDraw's seed and list get
// the same order.
//
// Every step is written out here, not left to rand.Shuffle: Go promises
// ChaCha8's output stream (math/rand/v2), but not how Shuffle or IntN
// turn it into indexes, and a draw must replay the same in any later
// release or language. For i from n-1 down to 1, j is the first 64-bit
// output x (as ChaCha8.Uint64 gives it) with x >= 2^64 mod (i+1), taken
// mod (i+1) (rejection, so every j is equally likely); then ids i and j
// swap. TestDrawOrder_KnownAnswer pins it.
func DrawOrder(seed [DrawSeedLen]byte, ticketIDs []string) []string {
	order := slices.Clone(ticketIDs)
	slices.Sort(order)
	src := mrand.NewChaCha8(seed)
	for i := len(order) - 1; i > 0; i-- {
		bound := uint64(i) + 1
		low := -bound % bound // 2^64 mod bound: the outputs below it would favour small j
		x := src.Uint64()
		for x < low {
			x = src.Uint64()
		}
		j := x % bound
		order[i], order[j] = order[j], order[i]
	}
	return order
}

// register enters r in sku's draw while its registration is open (before
// draw_at, and before the worker has recorded the seed): a ticket
// REGISTERED that holds nothing. A customer registers once; a second key
// of the same customer is refused CUSTOMER_LIMIT_REACHED. Registrations
// are bounded by the SKU's waitlist_max. A key used before draw_at is
// answered its ticket, as it is now, whenever it is retried.
func (s *Service) register(ctx context.Context, r TokenRequest, sku *stock.SKU) (Answer, error) {
	// A key with no ticket that holds a token granted directly (before
	// the SKU sold by draw) answers that token, as its retry would have
	// before; asked only once no ticket has the key, since an admitted
	// ticket's reserve has the same key.
	asked := stock.Ticket{SKU: r.SKU, Quantity: r.Quantity, IdempotencyKey: r.Key, CustomerRef: r.CustomerRef}
	granted := func(ctx context.Context) (*stock.Ticket, error) {
		got := make([]stock.TicketEntered, 1)
		if rest := s.grantedTokens(ctx, r.SKU, []stock.TicketEntry{{Ticket: asked}}, []int{0}, got); len(rest) > 0 {
			return nil, nil
		}
		return got[0].Ticket, got[0].Err
	}
	open := s.now().Before(sku.Admission.DrawAt)
	t, replayed, err := s.store.RegisterTicket(ctx, asked, paramsHash(r), sku.Admission.WaitlistMax, open, granted)
	if err != nil {
		return Answer{}, err
	}
	if !replayed {
		s.wake()
	}
	return Answer{Ticket: t, Replayed: replayed}, nil
}

// runDraw runs sku's draw once its registration has closed, and reports
// whether the draw is ranked (its tickets WAITING in drawn order, for the
// worker's pass to admit). The seed comes from crypto/rand and is
// recorded before anything else: if this worker stops after that, the
// next lease holder finds it recorded and draws with it, so every worker
// produces the same draw.
func (s *Service) runDraw(ctx context.Context, sku *stock.SKU) (bool, error) {
	if s.now().Before(sku.Admission.DrawAt) {
		return false, nil
	}
	var fresh [DrawSeedLen]byte
	_, _ = rand.Read(fresh[:]) // never fails (crypto/rand)
	seed, err := s.store.SeedDraw(ctx, sku.Name, fresh[:])
	if err != nil {
		return false, err
	}
	if s.AfterSeed != nil {
		if err := s.AfterSeed(sku.Name, seed); err != nil {
			return false, err
		}
	}
	return s.store.RankDraw(ctx, sku.Name, func(seed []byte, ids []string) []string {
		var key [DrawSeedLen]byte
		copy(key[:], seed) // DrawSeedLen bytes: admission_draws checks it
		return DrawOrder(key, ids)
	})
}

// Bounds of GetDraw's pages: a page of ids is 37 bytes an id; ten
// thousand is a few hundred kilobytes, under any message limit, and a
// replayer of a draw of a million registrations reads a hundred pages.
const (
	drawPageLenDefault = 1000
	drawPageLenMax     = 10_000
)

// GetDraw reads sku's draw: its state, draw_at, seed, and a page of its
// tickets in drawn order, from rank after+1 (pageLen 0: the default).
func (s *Service) GetDraw(ctx context.Context, sku string, after int64, pageLen int) (*stock.Draw, error) {
	if err := stock.ValidateSKU(sku); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, stock.Errorf(stock.CodeInvalidArgument, "page_token must be a rank the last page returned")
	}
	switch {
	case pageLen == 0:
		pageLen = drawPageLenDefault
	case pageLen < 0 || pageLen > drawPageLenMax:
		return nil, stock.Errorf(stock.CodeInvalidArgument, "page_size must be between 0 and %d", drawPageLenMax)
	}
	cfg, err := s.seller.SKU(ctx, sku)
	if err != nil {
		return nil, unavailable(err)
	}
	if cfg.Admission.Mode != stock.AdmissionDraw {
		return nil, stock.Errorf(stock.CodeInvalidArgument, "sku %q does not sell by draw", sku)
	}
	d, err := s.store.GetDraw(ctx, sku, after, pageLen)
	if err != nil {
		return nil, unavailable(err)
	}
	d.DrawAt = cfg.Admission.DrawAt
	return d, nil
}
