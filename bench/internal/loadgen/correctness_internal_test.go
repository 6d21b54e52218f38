package loadgen

import (
	"strings"
	"testing"
)

// TestCheckAcks shows that each kind of violation of an acknowledged answer
// is caught, by key or reservation id, and that an honest history, replays
// and unresolved operations included, passes.
func TestCheckAcks(t *testing.T) {
	deduct := func(ok, replayed int32) *keyObs { return &keyObs{op: opDeduct, qty: 1, ok: ok, replayed: replayed} }
	reserve := func(id string) *keyObs { return &keyObs{op: opReserve, qty: 1, ok: 1, id: id} }
	applied := func(kind string, n int64, id string) KeyRecord {
		return KeyRecord{Kind: kind, Applied: n, ReservationID: id}
	}
	for _, tc := range []struct {
		name       string
		keys       map[string]*keyObs
		res        map[string]*resObs
		sysKeys    map[string]KeyRecord
		sysRes     map[string]ReservationRecord
		lost, diff int64
		dup        int64
		detail     string // a detail line must contain it; "" for none at all
	}{{
		name: "Honest",
		keys: map[string]*keyObs{
			"d1": deduct(1, 0),
			"d2": deduct(0, 2), // the first answer was lost; replays tell it applied
			"d3": deduct(1, 1), // a duplicate replayed
			"d4": {op: opDeduct, qty: 1, unresolved: true},
			"d5": {op: opDeduct, qty: 1, unresolved: true}, // never applied: fine, nobody was told
			"d6": {op: opDeduct, qty: 1},                   // refused, and not applied
			"r1": reserve("res-1"), "r2": reserve("res-2"), "r3": reserve("res-3"), "r4": reserve("res-4"),
		},
		res: map[string]*resObs{
			"res-1": {key: "r1", qty: 1, commitOK: 1},
			"res-2": {key: "r2", qty: 1, releaseRpl: 1},
			"res-3": {key: "r3", qty: 1, unresolved: true}, // the commit's fate is unknown
		},
		sysKeys: map[string]KeyRecord{
			"d1": applied("deduct", 1, ""), "d2": applied("deduct", 1, ""), "d3": applied("deduct", 1, ""), "d4": applied("deduct", 1, ""),
			"r1": applied("reserve", 1, "res-1"), "r2": applied("reserve", 1, "res-2"), "r3": applied("reserve", 1, "res-3"), "r4": applied("reserve", 1, "res-4"),
		},
		sysRes: map[string]ReservationRecord{"res-1": {Committed: 1}, "res-2": {Released: 1}, "res-3": {}, "res-4": {Expired: 1}},
	}, {
		name:    "LostDeduct",
		keys:    map[string]*keyObs{"d1": deduct(1, 0), "d2": deduct(1, 0)},
		sysKeys: map[string]KeyRecord{"d1": applied("deduct", 1, "")},
		lost:    1, detail: "1 " + lostDeduct + " (e.g. d2)",
	}, {
		name:    "LostReplayedDeduct",
		keys:    map[string]*keyObs{"d1": deduct(0, 1)}, // only a replay came back, and the system has nothing
		sysKeys: map[string]KeyRecord{},
		lost:    1, detail: lostDeduct,
	}, {
		name:    "LostReserve",
		keys:    map[string]*keyObs{"r1": reserve("res-1")},
		sysKeys: map[string]KeyRecord{},
		sysRes:  map[string]ReservationRecord{},
		lost:    1, detail: lostReserve,
	}, {
		name:    "ReserveOfAnotherReservation",
		keys:    map[string]*keyObs{"r1": reserve("res-1")},
		sysKeys: map[string]KeyRecord{"r1": applied("reserve", 1, "res-9")},
		sysRes:  map[string]ReservationRecord{"res-9": {}},
		lost:    1, detail: "r1: answered res-1, holds res-9",
	}, {
		name:    "LostCommit",
		keys:    map[string]*keyObs{"r1": reserve("res-1")},
		res:     map[string]*resObs{"res-1": {key: "r1", qty: 1, commitOK: 1}},
		sysKeys: map[string]KeyRecord{"r1": applied("reserve", 1, "res-1")},
		sysRes:  map[string]ReservationRecord{"res-1": {}}, // still held: the sale is gone
		lost:    1, detail: lostCommit + " (e.g. res-1 (key r1))",
	}, {
		name:    "CommitThatExpired",
		keys:    map[string]*keyObs{"r1": reserve("res-1")},
		res:     map[string]*resObs{"res-1": {key: "r1", qty: 1, commitRepl: 1}},
		sysKeys: map[string]KeyRecord{"r1": applied("reserve", 1, "res-1")},
		sysRes:  map[string]ReservationRecord{"res-1": {Expired: 1}}, // a sold unit back on sale
		lost:    1, detail: lostCommit,
	}, {
		name:    "LostRelease",
		keys:    map[string]*keyObs{"r1": reserve("res-1")},
		res:     map[string]*resObs{"res-1": {key: "r1", qty: 1, releaseOK: 1}},
		sysKeys: map[string]KeyRecord{"r1": applied("reserve", 1, "res-1")},
		sysRes:  map[string]ReservationRecord{"res-1": {}},
		lost:    1, detail: lostRelease,
	}, {
		name:    "ReplayedKeyAppliedTwice",
		keys:    map[string]*keyObs{"d1": deduct(1, 1)}, // the client saw one success and a replay
		sysKeys: map[string]KeyRecord{"d1": applied("deduct", 2, "")},
		dup:     1, detail: dupKey + " (e.g. d1 x2)",
	}, {
		name:    "ReservationEndedTwice",
		keys:    map[string]*keyObs{"r1": reserve("res-1")},
		res:     map[string]*resObs{"res-1": {key: "r1", qty: 1, commitOK: 1}},
		sysKeys: map[string]KeyRecord{"r1": applied("reserve", 1, "res-1")},
		sysRes:  map[string]ReservationRecord{"res-1": {Committed: 1, Expired: 1}},
		dup:     1, detail: dupEnd,
	}, {
		name:    "RefusedButApplied",
		keys:    map[string]*keyObs{"d1": {op: opDeduct, qty: 1}}, // refused for certain
		sysKeys: map[string]KeyRecord{"d1": applied("deduct", 1, "")},
		diff:    1, detail: phantomRefused,
	}, {
		name:    "AppliedUnsent",
		keys:    map[string]*keyObs{},
		sysKeys: map[string]KeyRecord{"x": applied("deduct", 1, "")},
		diff:    1, detail: phantomUnsent,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := &skuView{keys: tc.keys, reservations: tc.res}
			var c Correctness
			dup := checkAcks(&c, "sku", v, SKUState{Keys: tc.sysKeys, Reservations: tc.sysRes})
			if c.Lost != tc.lost || c.Reconciliation != tc.diff || dup != tc.dup {
				t.Errorf("checkAcks = lost %d, differences %d, duplicates %d, want %d, %d, %d; details %q",
					c.Lost, c.Reconciliation, dup, tc.lost, tc.diff, tc.dup, c.Details)
			}
			if tc.detail == "" && len(c.Details) > 0 {
				t.Errorf("details %q, want none", c.Details)
			}
			if tc.detail != "" && !strings.Contains(strings.Join(c.Details, "\n"), tc.detail) {
				t.Errorf("details %q, want one containing %q", c.Details, tc.detail)
			}
		})
	}
}

// TestAssess_Lost shows that a lost acknowledged commit fails the run even
// when the SKU has unresolved operations (which skip the check of totals),
// and that a target that keeps no per-key records skips the check.
func TestAssess_Lost(t *testing.T) {
	skus := []SKUSpec{{SKU: "s", Stock: 10, Shards: 1}}
	tl := newTally(0, 0)
	tl.keys[keyID{sku: 0, key: "r1"}] = &keyObs{op: opReserve, qty: 2, ok: 1, id: "res-1"}
	tl.keys[keyID{sku: 0, key: "d1"}] = &keyObs{op: opDeduct, qty: 1, unresolved: true}
	tl.reservations["res-1"] = &resObs{sku: 0, key: "r1", qty: 2, commitOK: 1}
	// The database lost the commit: the reservation is still held.
	st := SKUState{Available: 8, Reserved: 2, Operations: 1, DistinctKeys: 1,
		Keys:         map[string]KeyRecord{"r1": {Kind: "reserve", Applied: 1, ReservationID: "res-1"}},
		Reservations: map[string]ReservationRecord{"res-1": {}}}

	c := assess(skus, tl, State{SKUs: map[string]SKUState{"s": st}})
	if c.Lost != 1 || c.Clean() || c.Unresolved != 1 {
		t.Errorf("assess = %+v, want 1 lost, 1 unresolved, not clean", c)
	}

	st.Keys, st.Reservations = nil, nil
	if c := assess(skus, tl, State{SKUs: map[string]SKUState{"s": st}}); c.Lost != 0 || !c.Clean() {
		t.Errorf("assess without records = %+v, want the check skipped", c)
	}
}
