package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// What the README's examples assume: `make run` on its default address,
// with the demo SKU it creates.
const (
	readmePath        = "../../README.md"
	readmeSection     = "## Using the API"
	readmeBase        = "http://127.0.0.1:8080"
	readmeGRPCAddr    = "127.0.0.1:8080"
	readmeTokenVar    = "SHARDSTOCK_ADMIN_TOKEN"
	readmeServiceVar  = "SHARDSTOCK_SERVICE_TOKEN"
	readmeDemoSKU     = "demo-sku"
	readmeDemoStock   = 1000
	readmeDemoShards  = 8
	readmeErrorMarker = "# error: "      // first line of an example that shows an error
	readmeNoJQMarker  = "# without jq: " // the line after a jq line: the same without jq
	readmeExampleMax  = 60 * time.Second
)

// readmeExample is one fenced sh block of the README's API section that
// calls curl or grpcurl.
type readmeExample struct {
	line    int    // of the opening fence, for messages
	script  string // as printed
	grpcurl bool
	reason  string // the error reason the README says it shows, or ""
	calls   int    // curl or grpcurl invocations
	methods []string
}

// readmeCall finds curl and grpcurl invocations: at the start of a line or
// of a command substitution.
var (
	readmeCall   = regexp.MustCompile(`(?m)(^|\$\()\s*(grpcurl|curl) `)
	readmeMethod = regexp.MustCompile(`shardstock\.v1\.(\w+Service/\w+)`)
)

// TestE2E_READMECurl runs the API examples of README.md as printed, in
// order, against a stack of its own set up as `make run` sets up its own:
// the README's address becomes the test allocator's, the admin token
// variable holds the test's token. Each example must exit 0 and print JSON
// answers without an error code, one per call, except those the README
// marks as showing an error, which must show that error. The grpcurl
// examples run when grpcurl is installed; an example that needs jq runs its
// printed sed alternative when jq is not installed.
func TestE2E_READMECurl(t *testing.T) {
	besideOthers(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	examples := readReadmeExamples(t)
	checkReadmeCoverage(t, examples)

	s := newStack(t, 3)
	s.createSKU(readmeDemoSKU, readmeDemoStock, readmeDemoShards)
	_, errGRPCurl := exec.LookPath("grpcurl")
	_, errJQ := exec.LookPath("jq")
	for i, ex := range examples {
		tool := "curl"
		if ex.grpcurl {
			tool = "grpcurl"
		}
		name := fmt.Sprintf("%02d_%s_%s", i+1, tool, strings.Join(ex.methods, "+"))
		t.Run(name, func(t *testing.T) {
			if ex.grpcurl && errGRPCurl != nil {
				t.Skip("grpcurl is not installed")
			}
			script := ex.script
			if errJQ != nil {
				script = withoutJQ(t, ex)
			}
			script = strings.ReplaceAll(script, readmeBase, s.base)
			script = strings.ReplaceAll(script, readmeGRPCAddr, strings.TrimPrefix(s.base, "http://"))
			stdout, stderr, err := runReadmeExample(script)
			where := fmt.Sprintf("README.md:%d", ex.line)
			if ex.reason != "" {
				checkReadmeError(t, where, ex, stdout, stderr, err)
				return
			}
			if err != nil {
				t.Fatalf("%s: example = %v\nstdout:\n%s\nstderr:\n%s", where, err, stdout, stderr)
			}
			answers, derr := decodeAnswers(stdout)
			if derr != nil {
				t.Fatalf("%s: output is not JSON answers: %v\nstdout:\n%s", where, derr, stdout)
			}
			if len(answers) != ex.calls {
				t.Errorf("%s: %d JSON answers, want one per call (%d)\nstdout:\n%s", where, len(answers), ex.calls, stdout)
			}
			for _, a := range answers {
				if code, ok := a["code"]; ok {
					t.Errorf("%s: answer has error code %v: %v", where, code, a)
				}
			}
		})
	}
	s.reconcile(readmeDemoSKU)
}

// readReadmeExamples returns the curl and grpcurl examples of the README's
// API section, in order.
func readReadmeExamples(t *testing.T) []readmeExample {
	t.Helper()
	f, err := os.Open(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out     []readmeExample
		in      bool // inside the API section
		block   *strings.Builder
		start   int
		lineNum int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNum++
		line := sc.Text()
		switch {
		case block != nil && strings.TrimSpace(line) == "```":
			if ex, ok := parseReadmeExample(block.String(), start); ok {
				out = append(out, ex)
			}
			block = nil
		case block != nil:
			block.WriteString(line + "\n")
		case strings.HasPrefix(line, "## "):
			in = strings.TrimSpace(line) == readmeSection
		case in && strings.TrimSpace(line) == "```sh":
			block, start = &strings.Builder{}, lineNum
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if block != nil {
		t.Fatalf("README.md:%d: unterminated code block", start)
	}
	return out
}

func parseReadmeExample(script string, line int) (readmeExample, bool) {
	calls := readmeCall.FindAllStringSubmatch(script, -1)
	if len(calls) == 0 {
		return readmeExample{}, false
	}
	ex := readmeExample{line: line, script: script, calls: len(calls), grpcurl: calls[0][2] == "grpcurl"}
	if first, _, _ := strings.Cut(script, "\n"); strings.HasPrefix(first, readmeErrorMarker) {
		ex.reason = strings.TrimSpace(strings.TrimPrefix(first, readmeErrorMarker))
	}
	for _, m := range readmeMethod.FindAllStringSubmatch(script, -1) {
		name := m[1][strings.Index(m[1], "/")+1:]
		if len(ex.methods) == 0 || ex.methods[len(ex.methods)-1] != name {
			ex.methods = append(ex.methods, name)
		}
	}
	return ex, true
}

// checkReadmeCoverage fails unless the README shows, with curl, every call
// it promises, and passes the admin token and the service token (to every
// InventoryService call but GetStock, which needs none) through their
// variables.
func checkReadmeCoverage(t *testing.T, examples []readmeExample) {
	t.Helper()
	shown := map[string]bool{}
	for _, ex := range examples {
		if ex.grpcurl {
			continue
		}
		for _, m := range readmeMethod.FindAllStringSubmatch(ex.script, -1) {
			shown[m[1]] = true
			if strings.HasPrefix(m[1], "AdminService/") && !strings.Contains(ex.script, "$"+readmeTokenVar) {
				t.Errorf("README.md:%d: admin example without \"Authorization: Bearer $%s\"", ex.line, readmeTokenVar)
			}
			if strings.HasPrefix(m[1], "InventoryService/") && m[1] != "InventoryService/GetStock" && !strings.Contains(ex.script, "$"+readmeServiceVar) {
				t.Errorf("README.md:%d: %s example without \"Authorization: Bearer $%s\"", ex.line, m[1], readmeServiceVar)
			}
		}
	}
	for _, m := range []string{
		"InventoryService/GetStock", "InventoryService/Reserve", "InventoryService/Commit", "InventoryService/Release",
		"InventoryService/Deduct", "InventoryService/GetOperation", "InventoryService/RequestToken",
		"AdminService/CreateSku", "AdminService/AdjustStock", "AdminService/Reconcile",
		"AdminService/SetShards", "AdminService/Rebalance", "AdminService/ListTransfers",
	} {
		if !shown[m] {
			t.Errorf("README.md: no curl example of %s under %q", m, readmeSection)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// withoutJQ replaces each line that uses jq with the line after it, which
// the README prints as the same command without jq.
func withoutJQ(t *testing.T, ex readmeExample) string {
	t.Helper()
	lines := strings.Split(ex.script, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "jq ") || strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], readmeNoJQMarker) {
			t.Fatalf("README.md:%d: an example uses jq, which is not installed, without a %q line after it", ex.line, readmeNoJQMarker)
		}
		lines[i] = strings.TrimPrefix(lines[i+1], readmeNoJQMarker)
	}
	return strings.Join(lines, "\n")
}

// runReadmeExample runs script with bash, with the admin and service
// tokens in their variables.
func runReadmeExample(script string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), readmeExampleMax)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Env = append(os.Environ(), readmeTokenVar+"="+adminToken, readmeServiceVar+"="+serviceToken)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// checkReadmeError checks an example the README marks as showing an error:
// curl prints the Connect error as JSON and exits 0; grpcurl prints it on
// stderr and exits non-zero.
func checkReadmeError(t *testing.T, where string, ex readmeExample, stdout, stderr string, err error) {
	t.Helper()
	if ex.grpcurl {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(stderr, `"reason": "`+ex.reason+`"`) {
			t.Errorf("%s: example = %v, want a non-zero exit and reason %s on stderr\nstdout:\n%s\nstderr:\n%s", where, err, ex.reason, stdout, stderr)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: example = %v\nstdout:\n%s\nstderr:\n%s", where, err, stdout, stderr)
	}
	answers, derr := decodeAnswers(stdout)
	if derr != nil || len(answers) != 1 {
		t.Fatalf("%s: want one JSON error answer, got %d (%v)\nstdout:\n%s", where, len(answers), derr, stdout)
	}
	var got struct {
		Code    string `json:"code"`
		Details []struct {
			Debug struct {
				Reason string `json:"reason"`
			} `json:"debug"`
		} `json:"details"`
	}
	b, _ := json.Marshal(answers[0])
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Code == "" || len(got.Details) == 0 || got.Details[0].Debug.Reason != ex.reason {
		t.Errorf("%s: answer %s, want an error with reason %s", where, b, ex.reason)
	}
}

// decodeAnswers decodes a stream of JSON objects (curl prints them back to
// back, grpcurl indented).
func decodeAnswers(s string) ([]map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	var out []map[string]any
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}
