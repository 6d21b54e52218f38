package proccpu_test

// An external test package: pgtest imports proccpu (BackendsCPU).

import (
	"testing"

	"github.com/shardstock/shardstock/internal/pgtest"
	"github.com/shardstock/shardstock/internal/proccpu"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestPostmaster(t *testing.T) {
	pid, err := proccpu.Postmaster(t.Context(), pgtest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := proccpu.Tree(pid)
	if err != nil || cpu <= 0 {
		t.Errorf("Tree(postmaster %d) = %s, %v, want some CPU", pid, cpu, err)
	}
	if _, err := proccpu.Postmaster(t.Context(), "postgres://db.example.com/x"); err == nil {
		t.Errorf("Postmaster of a remote server = nil error")
	}
}
