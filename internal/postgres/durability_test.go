package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardstock/shardstock/internal/postgres"
)

func TestDurability_Check(t *testing.T) {
	durable := postgres.Durability{SynchronousCommit: "on", Fsync: true}
	syncRepl := postgres.Durability{SynchronousCommit: "remote_apply", Fsync: true, SynchronousStandbyNames: "ANY 1 (*)", Standbys: 2}
	for _, tc := range []struct {
		name                   string
		d                      postgres.Durability
		requireSync            bool
		problems, warnings     int
		problemHas, warningHas string
	}{
		{"OK", durable, false, 0, 0, "", ""},
		{"SyncStandby", syncRepl, true, 0, 0, "", ""},
		{"AsyncCommit", postgres.Durability{SynchronousCommit: "off", Fsync: true}, false, 1, 0, "synchronous_commit=off", ""},
		{"FsyncOff", postgres.Durability{SynchronousCommit: "on"}, false, 0, 1, "", "fsync=off"},
		{"Standby", postgres.Durability{SynchronousCommit: "on", Fsync: true, InRecovery: true}, false, 1, 0, "standby", ""},
		{"AsyncReplicas", postgres.Durability{SynchronousCommit: "on", Fsync: true, Standbys: 1}, false, 0, 1, "", "asynchronously"},
		{"SyncRequiredNone", durable, true, 1, 0, "synchronous replication is required", ""},
		{"SyncRequiredLocal", postgres.Durability{SynchronousCommit: "local", Fsync: true, SynchronousStandbyNames: "s1"}, true, 1, 0, "synchronous_commit=local", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, w := tc.d.Check(tc.requireSync)
			if len(p) != tc.problems || len(w) != tc.warnings {
				t.Fatalf("Check(%+v, %v) = %q, %q; want %d problems, %d warnings", tc.d, tc.requireSync, p, w, tc.problems, tc.warnings)
			}
			if tc.problemHas != "" && !strings.Contains(p[0], tc.problemHas) {
				t.Errorf("problem %q does not name %q", p[0], tc.problemHas)
			}
			if tc.warningHas != "" && !strings.Contains(w[0], tc.warningHas) {
				t.Errorf("warning %q does not name %q", w[0], tc.warningHas)
			}
		})
	}
}

// TestDB_Durability reads the settings as the pool's sessions have them: a
// URL that turns synchronous_commit off for its sessions is seen.
func TestDB_Durability(t *testing.T) {
	db, url := mustOpen(t)
	d, err := db.Durability(context.Background())
	if err != nil || d.SynchronousCommit == "" || d.InRecovery {
		t.Fatalf("Durability() = %+v, %v; want the primary's settings", d, err)
	}
	off, err := postgres.Open(context.Background(), url+"&synchronous_commit=off", postgres.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	d, err = off.Durability(context.Background())
	if err != nil || d.SynchronousCommit != "off" {
		t.Fatalf("Durability() with synchronous_commit=off in the URL = %+v, %v; want off", d, err)
	}
	if p, _ := d.Check(false); len(p) == 0 {
		t.Errorf("Check() of synchronous_commit=off found no problem")
	}
}
