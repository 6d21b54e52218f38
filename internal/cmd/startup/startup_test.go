package startup

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/shardstock/shardstock/internal/postgres"
)

func TestEnvDefaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		vars     map[string]string
		wantTTL  time.Duration
		wantConn int
		wantOn   bool
		wantErr  string
	}{
		{"Defaults", nil, nil, 5 * time.Second, 16, true, ""},
		{"FromEnv", nil, map[string]string{"T_LEASE_TTL": "9s", "T_CONNS": "40", "T_ON": "0"}, 9 * time.Second, 40, false, ""},
		{"FlagWins", []string{"-db-max-conns", "8", "-on"}, map[string]string{"T_CONNS": "40", "T_ON": "0"}, 5 * time.Second, 8, true, ""},
		{"BadEnv", nil, map[string]string{"T_LEASE_TTL": "soon"}, 0, 0, false, `T_LEASE_TTL="soon"`},
		{"BadBool", nil, map[string]string{"T_ON": "maybe"}, 0, 0, false, `T_ON="maybe"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := NewEnvDefaults(func(k string) string { return tc.vars[k] })
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			ttl := fs.Duration("lease-ttl", env.Duration("T_LEASE_TTL", 5*time.Second), "")
			conns := fs.Int("db-max-conns", env.Int("T_CONNS", 16), "")
			on := fs.Bool("on", env.Bool("T_ON", true), "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := env.Err()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Err() = %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || *ttl != tc.wantTTL || *conns != tc.wantConn || *on != tc.wantOn {
				t.Errorf("Err() = %v; lease-ttl %s, db-max-conns %d, on %v; want %s, %d, %v", err, *ttl, *conns, *on, tc.wantTTL, tc.wantConn, tc.wantOn)
			}
		})
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := Logger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hello", "sku", "a")
	log.Debug("hidden")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line["msg"] != "hello" || line["sku"] != "a" {
		t.Errorf("json log line %q: %v", buf.String(), err)
	}
	buf.Reset()
	if log, err = Logger(&buf, "warn", "text"); err != nil {
		t.Fatal(err)
	}
	log.Warn("careful")
	if !strings.Contains(buf.String(), "msg=careful") {
		t.Errorf("text log line %q", buf.String())
	}
	if _, err := Logger(&buf, "info", "xml"); err == nil {
		t.Errorf("Logger(format xml) = nil error")
	}
	if _, err := Logger(&buf, "loud", "text"); err == nil {
		t.Errorf("Logger(level loud) = nil error")
	}
}

func TestWithMigrateURLs(t *testing.T) {
	dbs := map[string]string{"main": "postgres://svc@a/x", "second": "postgres://svc@b/y"}
	opts, err := WithMigrateURLs(postgres.Options{MaxConns: 4}, dbs, "postgres://owner@a/x", "second=postgres://owner@b/y")
	if err != nil {
		t.Fatal(err)
	}
	if opts["main"].MigrateURL != "postgres://owner@a/x" || opts["second"].MigrateURL != "postgres://owner@b/y" || opts["main"].MaxConns != 4 {
		t.Errorf("options %+v", opts)
	}
	if opts, err := WithMigrateURLs(postgres.Options{}, dbs, "", ""); err != nil || opts["main"].MigrateURL != "" || len(opts) != 2 {
		t.Errorf("without owners: %+v, %v", opts, err)
	}
	if _, err := WithMigrateURLs(postgres.Options{}, dbs, "", "third=postgres://owner@c/z"); err == nil {
		t.Error("an owner URL for a database that is not one: no error")
	}
}
