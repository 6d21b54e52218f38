package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the module's path; the map below names packages without it.
const module = "github.com/shardstock/shardstock/"

// modules are the directories of the modules the map covers: the product
// and the benchmarks (bench/, a module of its own that imports the
// product's packages).
var modules = []string{"../..", "../../bench"}

// layers is the map of docs/architecture.md ("Import directions"): each
// entry is a package path prefix (the longest match wins) and its layer.
// A package's own code may import packages of lower layers and those of
// its own entry, never higher or sideways. Layer test marks the
// test-support packages: only tests and other test-support packages may
// import them, and only they may import "testing".
var layers = map[string]int{
	"internal/stock":    0, // the domain
	"internal/batch":    0,
	"internal/proc":     0,
	"internal/freeport": 0,

	"internal/readiness": 0, // a leaf too: a process's readiness line
	"internal/pause":     0, // a leaf too: a wait that ends with its context
	"internal/keyset":    0, // a leaf too: a sold-out SKU's keys, as hashes
	"internal/failpoint": 0, // a leaf too: the e2e tests' fault points (a build tag)
	"internal/proccpu":   0, // a leaf too: CPU time from /proc, for the load generator and benchmarks

	"internal/ledger":      1, // pure logic over the domain
	"gen":                  1, // the API's generated types and Connect stubs
	"internal/pgcluster":   1, // the throwaway Postgres and the embedded etcd
	"internal/etcdembed":   1,
	"internal/postgres":    2, // adapters: pgx, etcd, the wire format
	"internal/topology":    2,
	"internal/wire":        2,
	"internal/auth":        2, // who calls: bearer tokens and JWTs
	"internal/transport":   3, // HTTP/2 servers and clients for Connect
	"internal/dbset":       3, // several databases: a SKU's calls to its own
	"internal/rebalance":   3, // the rebalancer: the allocator runs it, it imports no allocator code
	"internal/shard":       4, // the services
	"internal/allocator":   4,
	"internal/admission":   4, // tokens and the waitlist: over the allocator through interfaces of its own
	"internal/api":         5, // handlers, and what the commands do at start
	"internal/cmd/startup": 5,
	"internal/shardnode":   6,  // a shard server wired into a process
	"internal/cmd":         7,  // each command's Run
	"internal/cmd/devcmd":  8,  // dev tools: make run, the load generator
	"cmd":                  10, // mains

	"bench/internal/loadgen":  8, // the load generator (module bench)
	"bench/internal/baseline": 9, // the load generator's baselines
	"bench/cmd":               10,

	"internal/pgtest":                    test,
	"internal/etcdtest":                  test,
	"internal/faultproxy":                test,
	"bench/internal/loadgen/loadgentest": test,
	"internal/e2e":                       test,
	"internal/cmdtest":                   test,
	"internal/auth/authtest":             test,
	"internal/archtest":                  test,
}

// test is the layer of test-support packages.
const test = -1

// sideways are imports against the map that are known and due to go:
// importer -> imported, and why.
var sideways = map[[2]string]string{}

// infrastructure are the module paths the domain must not depend on, even
// indirectly.
var infrastructure = []string{
	"github.com/jackc/",
	"connectrpc.com/",
	"go.etcd.io/",
	"github.com/prometheus/",
	"google.golang.org/grpc",
}

// pkg is what go list says of one package.
type pkg struct {
	ImportPath   string
	Imports      []string // of its own code, not its tests
	Deps         []string // the same, transitively
	TestImports  []string
	XTestImports []string
}

// listPackages runs go list on the whole of every module of modules.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	var pkgs []pkg
	for _, dir := range modules {
		pkgs = append(pkgs, listModule(t, dir)...)
	}
	return pkgs
}

// listModule runs go list on the whole module in dir.
func listModule(t *testing.T, dir string) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, &stderr)
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		p.ImportPath = strings.TrimPrefix(p.ImportPath, module)
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list in %s found %d packages, want the whole module", dir, len(pkgs))
	}
	return pkgs
}

// entry returns the map's entry for path (module-relative) and its layer.
func entry(path string) (string, int, bool) {
	best := ""
	for prefix := range layers {
		if (path == prefix || strings.HasPrefix(path, prefix+"/")) && len(prefix) > len(best) {
			best = prefix
		}
	}
	if best == "" {
		return "", 0, false
	}
	return best, layers[best], true
}

// TestImports checks every package's imports against the map.
func TestImports(t *testing.T) {
	for _, p := range listPackages(t) {
		from, fromLayer, ok := entry(p.ImportPath)
		if !ok {
			t.Errorf("%s is not in the import map: give it a layer in docs/architecture.md (\"Import directions\") and in internal/archtest", p.ImportPath)
			continue
		}
		if from == "internal/stock" {
			if infra := infraDeps(p); len(infra) > 0 {
				t.Errorf("%s depends on %s (%d infrastructure packages in all): the domain imports no pgx, Connect, etcd or Prometheus",
					p.ImportPath, infra[0], len(infra))
			}
		}
		if fromLayer != test && slices.Contains(p.Imports, "testing") {
			t.Errorf("%s imports testing: only tests and test-support packages may", p.ImportPath)
		}
		// A library that imports testing is found only through the
		// commands' dependencies: their binaries must not link it.
		if (from == "cmd" || from == "bench/cmd") && slices.Contains(p.Deps, "testing") {
			t.Errorf("%s depends on package testing (go list -deps ./%s): a shipped binary links no test code", p.ImportPath, p.ImportPath)
		}
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if strings.HasPrefix(imp, module+"cmd/") {
				t.Errorf("%s imports %s: no package imports a command", p.ImportPath, imp)
			}
		}
		for _, imp := range p.Imports {
			rel, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			to, toLayer, ok := entry(rel)
			switch {
			case !ok: // reported as the package itself
			case toLayer == test && fromLayer != test:
				t.Errorf("%s imports %s, a test-support package: only tests may", p.ImportPath, rel)
			case fromLayer == test || to == from:
			case from == "internal/stock":
				t.Errorf("%s imports %s: the domain imports no other package of the module", p.ImportPath, rel)
			case toLayer >= fromLayer && sideways[[2]string{p.ImportPath, rel}] == "":
				t.Errorf("%s (layer %d) imports %s (layer %d): imports go down the map in docs/architecture.md (\"Import directions\")",
					p.ImportPath, fromLayer, rel, toLayer)
			}
		}
	}
}

// infraDeps returns p's infrastructure dependencies, the ones it imports
// itself first.
func infraDeps(p pkg) []string {
	isInfra := func(path string) bool {
		return slices.ContainsFunc(infrastructure, func(prefix string) bool { return strings.HasPrefix(path, prefix) })
	}
	var direct, all []string
	for _, d := range p.Imports {
		if isInfra(d) {
			direct = append(direct, d)
		}
	}
	for _, d := range p.Deps {
		if isInfra(d) && !slices.Contains(direct, d) {
			all = append(all, d)
		}
	}
	return append(direct, all...)
}
