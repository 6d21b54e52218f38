package ledger

import (
	"encoding/base64"
	"encoding/binary"
	"maps"
	"slices"
	"strings"

	"github.com/shardstock/shardstock/internal/stock"
)

// Position is a reader's place in one database's ledger, in commit order:
// the transaction that appended the last entry it took, and that entry's
// id. Entries are ordered by (xid, id); the zero Position is before all.
type Position struct {
	XID uint64
	ID  int64
}

// Less reports whether p is before q.
func (p Position) Less(q Position) bool {
	return p.XID < q.XID || p.XID == q.XID && p.ID < q.ID
}

// Change is a ledger entry and its position.
type Change struct {
	Entry stock.LedgerEntry
	Pos   Position
}

// Cursor bounds.
const (
	// cursorVersion prefixes every cursor; a cursor of another version is
	// refused, so that the format can change without a cursor being read
	// as something it is not.
	cursorVersion = "c1."
	// cursorDatabasesMax is the most databases a placement names
	// (stock.ValidateDatabases).
	cursorDatabasesMax = 255
	// CursorLenMax bounds a cursor's text: cursorDatabasesMax databases of
	// the longest names and positions, in base64.
	CursorLenMax = len(cursorVersion) + (cursorDatabasesMax*(1+stock.DatabaseNameLenMax+2*binary.MaxVarintLen64)+2)/3*4
)

// Cursor is where a consumer of the change stream is in every database:
// its Position in each. A database it does not name is read from its
// beginning, so a database added later is read whole. Its text (String)
// is opaque to consumers, versioned and checked when parsed.
type Cursor map[string]Position

// String is the cursor's text: cursorVersion, then in base64url (no
// padding), for each database in name order, its name's length and name,
// and its position's xid and id as unsigned varints.
func (c Cursor) String() string {
	var b []byte
	for _, name := range slices.Sorted(maps.Keys(c)) {
		p := c[name]
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, p.XID)
		b = binary.AppendUvarint(b, uint64(p.ID))
	}
	return cursorVersion + base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor reads a cursor's text; "" is the cursor before everything.
// Anything but a cursor String wrote (another version, bad base64, a
// database name that is not one, a name twice or out of order, a
// negative id, bytes left over) is INVALID_ARGUMENT.
func ParseCursor(s string) (Cursor, error) {
	c := Cursor{}
	if s == "" {
		return c, nil
	}
	if len(s) > CursorLenMax {
		return nil, badCursor("longer than %d characters", CursorLenMax)
	}
	body, ok := strings.CutPrefix(s, cursorVersion)
	if !ok {
		return nil, badCursor("not a cursor of this version (%q...)", cursorVersion)
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return nil, badCursor("not base64url")
	}
	var names []string
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || n == 0 || n > stock.DatabaseNameLenMax || uint64(len(b)-k) < n {
			return nil, badCursor("a database name's length is wrong")
		}
		name := string(b[k : k+int(n)])
		b = b[k+int(n):]
		if len(names) > 0 && name <= names[len(names)-1] {
			return nil, badCursor("databases out of order or twice")
		}
		names = append(names, name)
		var p Position
		var id uint64
		if p.XID, k = binary.Uvarint(b); k <= 0 {
			return nil, badCursor("a position is cut short")
		}
		b = b[k:]
		if id, k = binary.Uvarint(b); k <= 0 || id > 1<<63-1 {
			return nil, badCursor("a position is cut short or out of range")
		}
		b = b[k:]
		p.ID = int64(id)
		c[name] = p
	}
	if len(names) > cursorDatabasesMax {
		return nil, badCursor("more than %d databases", cursorDatabasesMax)
	}
	if len(names) > 0 {
		if err := stock.ValidateDatabases(names); err != nil {
			return nil, badCursor("%v", err)
		}
	}
	return c, nil
}

// clone returns a copy of c that the caller may change.
func (c Cursor) clone() Cursor { return maps.Clone(c) }

func badCursor(format string, args ...any) error {
	return stock.Errorf(stock.CodeInvalidArgument, "cursor: "+format+"; resume from a cursor the stream sent", args...)
}
