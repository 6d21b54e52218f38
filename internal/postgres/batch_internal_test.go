package postgres

import (
	"slices"
	"testing"
)

// joinParts numbers each part's arguments after those of the parts before
// it, and checks the row count of every part that asks, in its order.
func TestJoinParts(t *testing.T) {
	sql, args := joinParts([]writePart{
		{name: "a", sql: `INSERT INTO x SELECT $1, $2`, args: []any{"a1", "a2"}},
		{name: "b", sql: `UPDATE y SET v = $2 WHERE k = $1 AND w = $10 RETURNING 1`, args: []any{"b1", "b2"},
			check: &rowCheck{want: 3, what: "y rows", code: "SS002"}},
		{name: "c", sql: `INSERT INTO z SELECT $1`, args: []any{"c1"}},
	})
	want := "WITH a AS (INSERT INTO x SELECT $1, $2),\n" +
		"b AS (UPDATE y SET v = $4 WHERE k = $3 AND w = $12 RETURNING 1),\n" +
		"c AS (INSERT INTO z SELECT $6)\n" +
		"SELECT shardstock_expect((SELECT count(*) FROM b), $5, 'y rows', 'SS002')"
	if sql != want {
		t.Errorf("joinParts SQL =\n%s\nwant\n%s", sql, want)
	}
	if wantArgs := []any{"a1", "a2", "b1", "b2", 3, "c1"}; !slices.Equal(args, wantArgs) {
		t.Errorf("joinParts args = %v, want %v", args, wantArgs)
	}
	// The same parts again, other values: the SQL is the one built before,
	// the arguments are the new ones.
	sql2, args2 := joinParts([]writePart{
		{name: "a", sql: `INSERT INTO x SELECT $1, $2`, args: []any{"x1", "x2"}},
		{name: "b", sql: `UPDATE y SET v = $2 WHERE k = $1 AND w = $10 RETURNING 1`, args: []any{"y1", "y2"},
			check: &rowCheck{want: 5, what: "y rows", code: "SS002"}},
		{name: "c", sql: `INSERT INTO z SELECT $1`, args: []any{"z1"}},
	})
	if wantArgs := []any{"x1", "x2", "y1", "y2", 5, "z1"}; sql2 != want || !slices.Equal(args2, wantArgs) {
		t.Errorf("joinParts again = %q, %v; want the same SQL and args %v", sql2, args2, wantArgs)
	}
	if sql, _ := joinParts([]writePart{{name: "m", sql: `INSERT INTO m VALUES ($1)`, args: []any{1}}}); sql != "WITH m AS (INSERT INTO m VALUES ($1))\nSELECT 1" {
		t.Errorf("joinParts without checks = %q, want a statement ending in SELECT 1", sql)
	}
}
