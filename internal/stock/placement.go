package stock

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
)

// Placement of SKUs on databases.
//
// Every SKU lives in one database (all its shards, so that its idempotency
// keys stay under one unique index). Which one is decided by the SKU's slot,
// a hash of its name mod PlacementSlots, and a table of slot -> database: a
// few kilobytes in one etcd key whatever the number of SKUs.
//
// The table is versioned. A new SKU goes where the newest version puts its
// slot, and stays there: publishing a version (to add a database) moves no
// existing SKU. A SKU is found by trying, newest first, the databases that
// the versions name for its slot (Candidates); a slot that no version
// changed has one candidate, so the lookup is a computation, not a query.
const (
	// PlacementSlots is the number of slots SKUs hash to.
	PlacementSlots = 1024
	// PlacementVersionsMax bounds the versions kept, and so the databases
	// tried for one SKU.
	PlacementVersionsMax = 16
	// DatabaseNameLenMax bounds a database's name.
	DatabaseNameLenMax = 32
	// DefaultDatabase names the database of a deployment that names none.
	DefaultDatabase = "main"
)

// Placement is the versioned slot table, newest version last.
type Placement struct {
	Versions []PlacementVersion `json:"versions"`
}

// PlacementVersion maps every slot to a database, by index into Databases.
type PlacementVersion struct {
	Version   int64    `json:"version"`
	Databases []string `json:"databases"`
	Slots     []uint8  `json:"slots"` // len PlacementSlots
}

// SlotOf is the placement slot of sku.
func SlotOf(sku string) int {
	h := fnv.New32a()
	h.Write([]byte("placement:"))
	h.Write([]byte(sku))
	return int(h.Sum32() % PlacementSlots)
}

// SinglePlacement places every SKU on database name.
func SinglePlacement(name string) Placement {
	return Placement{Versions: []PlacementVersion{spread(1, []string{name})}}
}

// spread returns version v, which deals the slots out to dbs in turn.
func spread(v int64, dbs []string) PlacementVersion {
	pv := PlacementVersion{Version: v, Databases: dbs, Slots: make([]uint8, PlacementSlots)}
	for i := range pv.Slots {
		pv.Slots[i] = uint8(i % len(dbs))
	}
	return pv
}

// ValidateDatabases checks a list of database names for a new version.
func ValidateDatabases(dbs []string) error {
	if len(dbs) == 0 || len(dbs) > 255 {
		return invalid("databases: want 1..255 names, got %d", len(dbs))
	}
	seen := map[string]bool{}
	for _, d := range dbs {
		if d == "" || len(d) > DatabaseNameLenMax {
			return invalid("database name %q: want 1..%d characters", d, DatabaseNameLenMax)
		}
		for _, r := range d {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return invalid("database name %q: only a-z, 0-9, '-' and '_'", d)
			}
		}
		if seen[d] {
			return invalid("database name %q given twice", d)
		}
		seen[d] = true
	}
	return nil
}

func invalid(format string, args ...any) error {
	return Errorf(CodeInvalidArgument, format, args...)
}

// Next returns p with a new newest version that spreads the slots evenly
// over dbs. Slots keep their database where the even share allows, so that
// as few slots as possible change (and so as few SKUs need a second
// lookup); the oldest versions beyond PlacementVersionsMax are dropped only
// if no slot needs them, else Next fails.
func (p Placement) Next(dbs []string) (Placement, error) {
	if err := ValidateDatabases(dbs); err != nil {
		return p, err
	}
	if len(p.Versions) == 0 {
		return Placement{Versions: []PlacementVersion{spread(1, dbs)}}, nil
	}
	last := p.Versions[len(p.Versions)-1]
	if len(p.Versions) >= PlacementVersionsMax {
		return p, Errorf(CodePlacementFull, "placement has %d versions, the most kept", PlacementVersionsMax)
	}
	next := PlacementVersion{Version: last.Version + 1, Databases: dbs, Slots: make([]uint8, PlacementSlots)}
	share := PlacementSlots / len(dbs)
	extra := PlacementSlots % len(dbs) // the first extra databases get one more
	quota := make([]int, len(dbs))
	for i := range quota {
		quota[i] = share
		if i < extra {
			quota[i]++
		}
	}
	var moved []int
	for slot, old := range last.Slots {
		i := slices.Index(dbs, last.Databases[old])
		if i >= 0 && quota[i] > 0 {
			next.Slots[slot] = uint8(i)
			quota[i]--
			continue
		}
		moved = append(moved, slot)
	}
	i := 0
	for _, slot := range moved {
		for quota[i] == 0 {
			i++
		}
		next.Slots[slot] = uint8(i)
		quota[i]--
	}
	return Placement{Versions: append(slices.Clone(p.Versions), next)}, nil
}

// Version is the newest version's number, 0 for none.
func (p Placement) Version() int64 {
	if len(p.Versions) == 0 {
		return 0
	}
	return p.Versions[len(p.Versions)-1].Version
}

// Newest is the database a new SKU named sku goes to.
func (p Placement) Newest(sku string) string {
	last := p.Versions[len(p.Versions)-1]
	return last.Databases[last.Slots[SlotOf(sku)]]
}

// Candidates are the databases that may hold sku, newest version first,
// each once.
func (p Placement) Candidates(sku string) []string {
	slot := SlotOf(sku)
	out := make([]string, 0, 1)
	for i := len(p.Versions) - 1; i >= 0; i-- {
		v := p.Versions[i]
		d := v.Databases[v.Slots[slot]]
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// Databases are every database any version names, sorted.
func (p Placement) Databases() []string {
	var out []string
	for _, v := range p.Versions {
		for _, d := range v.Databases {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	slices.Sort(out)
	return out
}

// SlotCounts are the slots each database has in the newest version.
func (p Placement) SlotCounts() map[string]int {
	out := map[string]int{}
	if len(p.Versions) == 0 {
		return out
	}
	last := p.Versions[len(p.Versions)-1]
	for _, i := range last.Slots {
		out[last.Databases[i]]++
	}
	return out
}

// Check reports whether p is well formed: versions ascending, every slot
// naming one of its version's databases.
func (p Placement) Check() error {
	if len(p.Versions) == 0 {
		return errors.New("placement: no version")
	}
	for i, v := range p.Versions {
		if i > 0 && v.Version <= p.Versions[i-1].Version {
			return fmt.Errorf("placement: version %d after %d", v.Version, p.Versions[i-1].Version)
		}
		if err := ValidateDatabases(v.Databases); err != nil {
			return fmt.Errorf("placement version %d: %w", v.Version, err)
		}
		if len(v.Slots) != PlacementSlots {
			return fmt.Errorf("placement version %d: %d slots, want %d", v.Version, len(v.Slots), PlacementSlots)
		}
		for _, s := range v.Slots {
			if int(s) >= len(v.Databases) {
				return fmt.Errorf("placement version %d: slot names database %d of %d", v.Version, s, len(v.Databases))
			}
		}
	}
	return nil
}
