package postgres

// The external tests (package postgres_test, which may import
// internal/pgtest, itself an importer of this package) migrate step by step
// with these.
var (
	// Migrations is the embedded migrations' directory.
	Migrations = mustSub(migrations, "migrations")
	// Migrate applies every pending migration as cfg's role.
	Migrate = migrate
)

// The entry batch's per-key and per-customer reads, whose plans
// TestDB_TicketReadsProbeIndexes checks.
const (
	SQLTicketsByKey   = sqlTicketsByKey
	SQLCustomerHolds  = sqlCustomerHolds
	SQLOpenTicketSKUs = sqlOpenTicketSKUs
	SQLOpenTickets    = sqlOpenTickets
)
