package loadgen

import (
	"fmt"
	"sort"
	"strings"
)

// Correctness is the source document's correctness line (section 八.3),
// computed from what the clients observed and the target's final state.
type Correctness struct {
	// Oversold: units granted beyond stock + replenished:
	// max(0, successful units - stock - replenished), from the clients'
	// answers or from the final counts, whichever is larger.
	Oversold int64
	// Undersold: units left available on SKUs that answered OUT_OF_STOCK to
	// a request that would have fit (its quantity was at most the final
	// available, less any stock that releases may have returned after the
	// request started).
	Undersold int64
	// FalseSoldOut counts those refusals.
	FalseSoldOut int64
	// Duplicates: extra applications of one key (or one reservation's
	// commit or release): answers that succeeded more than once as
	// non-replays, or the system's own records holding more operations
	// than distinct keys plus more ends than reservations, whichever is
	// larger.
	Duplicates int64
	// Reconciliation counts differences: the system's own (ledger against
	// rows), conservation (available + reserved + sold + in transit =
	// stock + replenished), and client against system (sold, reserved and
	// successful keys as the clients saw them, for SKUs where every client
	// operation got a definite answer).
	Reconciliation int64
	// Lost counts acknowledged operations that the system does not hold,
	// each looked up in the system's own records (State's Keys and
	// Reservations) by its idempotency key or reservation id: a deduct or
	// reserve answered as a success whose key was never applied (or
	// applied as another reservation than the one answered), a commit
	// answered as a success whose reservation is not committed, a release
	// whose reservation is not released. Checked for every acknowledged
	// operation, unresolved ones beside it or not.
	Lost int64
	// HalfHeld counts orders (the cart model) whose lines did not all end
	// alike: some held or committed while others were never held or
	// released, or an order refused with a line still held or sold.
	HalfHeld int64
	// RefundBeyondSale counts units refunded beyond what their sale sold
	// (the cart model), by the system's own records.
	RefundBeyondSale int64
	// Unresolved counts client operations that never got a definite answer;
	// their SKUs skip the client-against-system check of the totals.
	Unresolved int64
	// Details explain the non-zero numbers, a line each (at most 20).
	Details []string
}

// Clean reports whether every correctness number is zero.
func (c Correctness) Clean() bool {
	return c.Oversold == 0 && c.Undersold == 0 && c.Duplicates == 0 && c.Lost == 0 && c.Reconciliation == 0 &&
		c.HalfHeld == 0 && c.RefundBeyondSale == 0
}

func (c *Correctness) detail(format string, args ...any) {
	if len(c.Details) < detailLinesMax {
		c.Details = append(c.Details, fmt.Sprintf(format, args...))
	}
}

// skuView is what the clients saw of one SKU.
type skuView struct {
	deducted, reserved int64 // units granted, duplicates included
	committed          int64 // units committed, duplicates included
	released           int64 // units released, duplicates included
	releasedOnce       int64 // units released, each reservation once
	successKeys        int64
	duplicates         int64
	unresolved         int64
	oos                []oosEvent
	releases           []releaseEvent
	keys               map[string]*keyObs // by idempotency key
	reservations       map[string]*resObs // by reservation id
}

// applied is how many times the clients saw an operation take effect: each
// non-replayed success, or once if only replays came back (the first
// attempt's answer was lost).
func applied(ok, replayed int32) int64 {
	if ok == 0 && replayed > 0 {
		return 1
	}
	return int64(ok)
}

// assess computes the correctness line.
func assess(skus []SKUSpec, t *tally, st State) Correctness {
	views := make([]skuView, len(skus))
	for i := range views {
		views[i].keys, views[i].reservations = map[string]*keyObs{}, map[string]*resObs{}
	}
	for id, k := range t.keys {
		v := &views[id.sku]
		v.keys[id.key] = k
		if k.unresolved {
			v.unresolved++
		}
		n := applied(k.ok, k.replayed)
		if n > 0 {
			v.successKeys++
		}
		v.duplicates += max(0, int64(k.ok)-1)
		if k.op == opDeduct {
			v.deducted += n * k.qty
		} else {
			v.reserved += n * k.qty
		}
	}
	for id, r := range t.reservations {
		v := &views[r.sku]
		v.reservations[id] = r
		if r.unresolved {
			v.unresolved++
		}
		c, rel := applied(r.commitOK, r.commitRepl), applied(r.releaseOK, r.releaseRpl)
		v.committed += c * r.qty
		v.released += rel * r.qty
		v.releasedOnce += min(rel, 1) * r.qty
		v.duplicates += max(0, int64(r.commitOK)-1) + max(0, int64(r.releaseOK)-1)
		if c > 0 && rel > 0 {
			v.duplicates++ // ended twice: committed and released
		}
	}
	for _, e := range t.oosEvents {
		views[e.sku].oos = append(views[e.sku].oos, e)
	}
	for _, e := range t.releases {
		views[e.sku].releases = append(views[e.sku].releases, e)
	}

	var c Correctness
	for i, spec := range skus {
		v := &views[i]
		c.Unresolved += v.unresolved
		s, ok := st.SKUs[spec.SKU]
		if !ok {
			c.Reconciliation++
			c.detail("%s: missing from the final state", spec.SKU)
			continue
		}
		assessSKU(&c, spec, v, s)
	}
	return c
}

func assessSKU(c *Correctness, spec SKUSpec, v *skuView, s SKUState) {
	allowed := spec.Stock + s.Replenished

	// Oversold.
	granted := v.deducted + v.reserved - v.releasedOnce
	stateSold := s.Sold + max(s.Reserved, 0)
	if over := max(0, granted-allowed, stateSold-allowed, -s.Available); over > 0 {
		c.Oversold += over
		c.detail("%s: oversold %d units: clients hold %d, the system sold+reserved %d, available %d, of stock %d + replenished %d",
			spec.SKU, over, granted, stateSold, s.Available, spec.Stock, s.Replenished)
	}

	// Undersold: a refusal is false when, all through the request, the SKU
	// had at least its quantity. Available only falls, except through
	// releases (and replenishment, whose time is unknown here), so from the
	// request's start on it was at least final - (what releases ending
	// after that start may have returned).
	if final := s.Available + s.InTransit; final > 0 && len(v.oos) > 0 {
		if n := falseRefusals(v, final, max(0, s.Replenished)); n > 0 {
			c.Undersold += final
			c.FalseSoldOut += n
			c.detail("%s: undersold: %d units left while %d requests that fit were refused as out of stock", spec.SKU, final, n)
		}
	}

	// Every acknowledged operation, looked up in the system's records.
	var keyDup int64
	if s.Keys != nil || s.Reservations != nil {
		keyDup = checkAcks(c, spec.SKU, v, s)
	}

	// Duplicates.
	if dup := max(v.duplicates, s.Operations-s.DistinctKeys+s.ExtraEnds, keyDup); dup > 0 {
		c.Duplicates += dup
		c.detail("%s: %d duplicate applications: clients saw %d repeated successes; the system holds %d operations for %d distinct keys and %d extra reservation ends",
			spec.SKU, dup, v.duplicates, s.Operations, s.DistinctKeys, s.ExtraEnds)
	}

	// Reconciliation.
	for i, d := range s.Discrepancies {
		c.Reconciliation++
		if i < 3 {
			c.detail("%s: %s (shard %d): %s: expected %d, actual %d", spec.SKU, d.Check, d.Shard, d.Detail, d.Expected, d.Actual)
		}
	}
	if total := s.Available + s.Reserved + s.Sold + s.InTransit; total != allowed {
		c.Reconciliation++
		c.detail("%s: conservation: available %d + reserved %d + sold %d + in transit %d = %d, want stock %d + replenished %d = %d",
			spec.SKU, s.Available, s.Reserved, s.Sold, s.InTransit, total, spec.Stock, s.Replenished, allowed)
	}
	if v.unresolved > 0 {
		return
	}
	check := func(what string, want, got int64) {
		if want != got {
			c.Reconciliation++
			c.detail("%s: client against system: %s: clients saw %d, the system has %d", spec.SKU, what, want, got)
		}
	}
	check("sold", v.deducted+v.committed, s.Sold)
	check("reserved", v.reserved-v.committed-v.released, s.Reserved)
	check("successful keys", v.successKeys, s.DistinctKeys)
}

// falseRefusals counts the out-of-stock answers of v whose quantity fitted
// in final less the stock that releases ending after the request's start
// (plus extra) may have returned.
func falseRefusals(v *skuView, final, extra int64) int64 {
	rel := v.releases
	sort.Slice(rel, func(i, j int) bool { return rel[i].end < rel[j].end })
	// late[i] = units of releases rel[i:].
	late := make([]int64, len(rel)+1)
	for i := len(rel) - 1; i >= 0; i-- {
		late[i] = late[i+1] + rel[i].qty
	}
	var n int64
	for _, e := range v.oos {
		i := sort.Search(len(rel), func(i int) bool { return rel[i].end > e.start })
		if e.qty <= final-late[i]-extra {
			n++
		}
	}
	return n
}

// Kinds of violation that checkAcks finds, as its detail lines name them.
const (
	lostDeduct       = "acknowledged deducts not in the system"
	lostReserve      = "acknowledged reserves not in the system"
	lostReservation  = "acknowledged reserves whose key holds another reservation"
	lostCommit       = "acknowledged commits whose reservation is not committed"
	lostRelease      = "acknowledged releases whose reservation is not released"
	dupKey           = "keys applied more than once"
	dupEnd           = "reservations ended more than once"
	phantomRefused   = "keys answered with a refusal but applied"
	phantomUnsent    = "keys applied that no client sent"
	ackExamplesMax   = 3 // keys or ids named per kind and SKU
	ackDetailKindMax = 9 // kinds above
)

// ackFindings gathers checkAcks's violations of one SKU by kind, in order of
// first appearance, with up to ackExamplesMax examples each.
type ackFindings struct {
	kinds    []string
	n        map[string]int64
	examples map[string][]string
}

func (f *ackFindings) add(kind, example string, n int64) {
	if f.n == nil {
		f.n, f.examples = make(map[string]int64, ackDetailKindMax), make(map[string][]string, ackDetailKindMax)
	}
	if _, ok := f.n[kind]; !ok {
		f.kinds = append(f.kinds, kind)
	}
	f.n[kind] += n
	if len(f.examples[kind]) < ackExamplesMax {
		f.examples[kind] = append(f.examples[kind], example)
	}
}

// checkAcks looks every operation the clients saw acknowledged up in the
// system's own records, by key or reservation id, and adds what is missing
// to c.Lost, and keys applied without a success to c.Reconciliation. It
// returns the extra applications it found (keys applied, reservations
// ended more than once), which the caller counts as duplicates.
//
// Unlike the check of totals it needs no SKU free of unresolved operations:
// an acknowledged operation must be in the system whatever else happened.
func checkAcks(c *Correctness, sku string, v *skuView, s SKUState) (dup int64) {
	var f ackFindings
	keys := sortedMapKeys(v.keys)
	for _, key := range keys {
		k := v.keys[key]
		rec, held := s.Keys[key]
		held = held && rec.Applied > 0
		switch {
		case applied(k.ok, k.replayed) == 0:
			// Refused for certain, yet applied: a client was told no and
			// charged. An unresolved key may or may not be applied.
			if held && !k.unresolved {
				f.add(phantomRefused, key, 1)
			}
		case k.op == opDeduct && (!held || rec.Kind != opDeduct.String()):
			f.add(lostDeduct, key, 1)
		case k.op == opReserve && (!held || rec.Kind != opReserve.String()):
			f.add(lostReserve, key, 1)
		case k.op == opReserve && k.id != "" && rec.ReservationID != k.id:
			f.add(lostReservation, fmt.Sprintf("%s: answered %s, holds %s", key, k.id, rec.ReservationID), 1)
		}
	}
	for _, key := range sortedMapKeys(s.Keys) {
		rec := s.Keys[key]
		if rec.Applied > 1 {
			f.add(dupKey, fmt.Sprintf("%s x%d", key, rec.Applied), rec.Applied-1)
			dup += rec.Applied - 1
		}
		if _, sent := v.keys[key]; !sent && rec.Applied > 0 {
			f.add(phantomUnsent, key, 1)
		}
	}
	for _, id := range sortedMapKeys(v.reservations) {
		r := v.reservations[id]
		rec := s.Reservations[id]
		if applied(r.commitOK, r.commitRepl) > 0 && rec.Committed == 0 {
			f.add(lostCommit, fmt.Sprintf("%s (key %s)", id, r.key), 1)
		}
		if applied(r.releaseOK, r.releaseRpl) > 0 && rec.Released == 0 {
			f.add(lostRelease, fmt.Sprintf("%s (key %s)", id, r.key), 1)
		}
	}
	for _, id := range sortedMapKeys(s.Reservations) {
		if n := s.Reservations[id].Ends(); n > 1 {
			f.add(dupEnd, fmt.Sprintf("%s x%d", id, n), n-1)
			dup += n - 1
		}
	}

	for _, kind := range f.kinds {
		n := f.n[kind]
		switch kind {
		case lostDeduct, lostReserve, lostReservation, lostCommit, lostRelease:
			c.Lost += n
		case phantomRefused, phantomUnsent:
			c.Reconciliation += n
		}
		c.detail("%s: client against system, by key: %d %s (e.g. %s)", sku, n, kind, strings.Join(f.examples[kind], ", "))
	}
	return dup
}

// sortedMapKeys returns m's keys in order, so that detail lines do not
// depend on map order.
func sortedMapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
