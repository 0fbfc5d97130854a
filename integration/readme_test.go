package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// The README's and the guides' examples are tested: every shell block
// after a marker
//
//	<!-- test: NAME [wait] [no-output] [exit=N] [couchdb] -->
//
// in README.md and in the files of docFiles runs, file after file in that
// order and in each file's order, in one bash per block, against one
// couchrep node and two PouchDB Servers this test starts (so a guide's
// examples may use what an earlier file's made). The fenced block that follows the
// commands (before any other marker or heading) is what the README says they
// print; the test fails when they print something else. `wait` re-runs the
// block until its output matches (for states that take a moment to reach),
// `no-output` checks the exit status only, `exit=N` expects that status.
// `couchdb` marks an example that needs an Apache CouchDB: it runs in
// TestTakeoverGoingBack (make test-couchdb), not here.
//
// The block marked `<!-- test: env -->` sets the variables the examples use
// (`export NAME=value`): the test runs the examples with its own servers'
// URLs in those variables instead, and replaces the README's values with them
// in the expected outputs. README.md's first marked block is one; a guide
// may have its own (its values then stand for the test's in that file).
//
// Expected outputs match structurally when they are JSON (one or more
// values, indented or not): the same keys and values, where a string
// "<anything>" stands for any value, an object key "..." allows more keys,
// and an array ending in "..." allows more elements. Other outputs match
// line by line, runs of spaces matching any run of spaces and <anything>
// any text.

// readmeExample is one marked block of README.md.
type readmeExample struct {
	name     string
	line     int // of the marker, for messages
	wait     bool
	noOutput bool
	// couchdb: the example needs an Apache CouchDB (its _config,
	// _scheduler): TestTakeoverGoingBack runs it, TestReadmeExamples not.
	couchdb bool
	exit    int
	script  string
	want    string // expected output; "" with noOutput
}

var markerRE = regexp.MustCompile(`^<!--\s*test:\s*(.*?)\s*-->\s*$`)

// parseReadme returns the README's marked examples in order.
func parseReadme(text string) ([]readmeExample, error) {
	lines := strings.Split(text, "\n")
	var out []readmeExample
	// fence returns the body of the fenced block opening at or after i
	// (skipping prose, stopping at a marker or heading), and the line after it.
	fence := func(i int, what string, stopAtProse bool) (string, int, error) {
		for ; i < len(lines); i++ {
			l := lines[i]
			if strings.HasPrefix(l, "```") {
				break
			}
			if markerRE.MatchString(l) || strings.HasPrefix(l, "#") || (stopAtProse && strings.TrimSpace(l) != "") {
				return "", i, fmt.Errorf("line %d: %s: no fenced block", i+1, what)
			}
		}
		if i == len(lines) {
			return "", i, fmt.Errorf("%s: no fenced block before the end", what)
		}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			return "", i, fmt.Errorf("%s: unterminated fenced block", what)
		}
		return strings.Join(body, "\n"), i + 1, nil
	}
	for i := 0; i < len(lines); i++ {
		m := markerRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		f := strings.Fields(m[1])
		if len(f) == 0 {
			return nil, fmt.Errorf("line %d: test marker without a name", i+1)
		}
		ex := readmeExample{name: f[0], line: i + 1}
		for _, o := range f[1:] {
			switch {
			case o == "wait":
				ex.wait = true
			case o == "no-output":
				ex.noOutput = true
			case o == "couchdb":
				ex.couchdb = true
			case strings.HasPrefix(o, "exit="):
				if _, err := fmt.Sscanf(o, "exit=%d", &ex.exit); err != nil {
					return nil, fmt.Errorf("line %d: bad %q", i+1, o)
				}
			default:
				return nil, fmt.Errorf("line %d: unknown test option %q", i+1, o)
			}
		}
		script, next, err := fence(i+1, "test "+ex.name, true)
		if err != nil {
			return nil, err
		}
		ex.script = script
		if !ex.noOutput && ex.name != "env" {
			want, after, err := fence(next, "test "+ex.name+" output", false)
			if err != nil {
				return nil, err
			}
			ex.want, next = want, after
		}
		out = append(out, ex)
		i = next - 1
	}
	return out, nil
}

var exportRE = regexp.MustCompile(`^\s*export\s+([A-Z_][A-Z0-9_]*)=(\S+)`)

// readmeEnv reads the env block's `export NAME=value` lines.
func readmeEnv(script string) map[string]string {
	env := map[string]string{}
	for _, l := range strings.Split(script, "\n") {
		if m := exportRE.FindStringSubmatch(l); m != nil {
			env[m[1]] = m[2]
		}
	}
	return env
}

// substitute replaces the README's values of the variables with the test's
// (longest first, so that a value containing another is replaced whole).
func substitute(s string, readme, actual map[string]string) string {
	names := make([]string, 0, len(readme))
	for n := range readme {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(readme[names[i]]) > len(readme[names[j]]) })
	pairs := []string{}
	for _, n := range names {
		if a, ok := actual[n]; ok {
			pairs = append(pairs, readme[n], a)
		}
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// jsonValues decodes s as a sequence of JSON values; ok is false if s is
// not entirely JSON.
func jsonValues(s string) ([]any, bool) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var vals []any
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return vals, len(vals) > 0
		}
		if err != nil {
			return nil, false
		}
		vals = append(vals, v)
	}
}

func isPlaceholder(v any) bool {
	s, ok := v.(string)
	return ok && len(s) >= 2 && s[0] == '<' && s[len(s)-1] == '>'
}

// matchJSON reports where got differs from want ("" when it matches).
func matchJSON(path string, want, got any) string {
	if isPlaceholder(want) {
		return ""
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: want an object, got %s", path, short(got))
		}
		_, more := w["..."]
		for k, wv := range w {
			if k == "..." {
				continue
			}
			gv, ok := g[k]
			if !ok {
				return fmt.Sprintf("%s.%s: missing", path, k)
			}
			if d := matchJSON(path+"."+k, wv, gv); d != "" {
				return d
			}
		}
		if !more {
			for k := range g {
				if _, ok := w[k]; !ok {
					return fmt.Sprintf("%s.%s: not in the README (%s)", path, k, short(g[k]))
				}
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok {
			return fmt.Sprintf("%s: want an array, got %s", path, short(got))
		}
		more := len(w) > 0 && w[len(w)-1] == "..."
		if more {
			w = w[:len(w)-1]
		}
		if len(g) < len(w) || (!more && len(g) != len(w)) {
			return fmt.Sprintf("%s: %d elements, the README shows %d", path, len(g), len(w))
		}
		for i := range w {
			if d := matchJSON(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
				return d
			}
		}
		return ""
	case string:
		if g, ok := got.(string); ok && placeholderRE.MatchString(w) && placeholderPattern(w).MatchString(g) {
			return ""
		}
		if g, ok := got.(string); !ok || g != w {
			return fmt.Sprintf("%s: got %s, the README shows %s", path, short(got), short(want))
		}
		return ""
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) || fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) {
			return fmt.Sprintf("%s: got %s, the README shows %s", path, short(got), short(want))
		}
		return ""
	}
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

var placeholderRE = regexp.MustCompile(`<[^<>]*>`)

// placeholderPattern matches s with each <...> standing for any text.
func placeholderPattern(s string) *regexp.Regexp {
	var re strings.Builder
	re.WriteString("^")
	last := 0
	for _, loc := range placeholderRE.FindAllStringIndex(s, -1) {
		re.WriteString(regexp.QuoteMeta(s[last:loc[0]]))
		re.WriteString(".*?")
		last = loc[1]
	}
	re.WriteString(regexp.QuoteMeta(s[last:]))
	re.WriteString("$")
	return regexp.MustCompile(re.String())
}

// matchText compares outputs line by line (see the package comment above).
func matchText(want, got string) string {
	wl := strings.Split(strings.TrimRight(want, "\n"), "\n")
	gl := strings.Split(strings.TrimRight(got, "\n"), "\n")
	if len(wl) != len(gl) {
		return fmt.Sprintf("%d lines, the README shows %d", len(gl), len(wl))
	}
	for i, w := range wl {
		var re strings.Builder
		re.WriteString(`^\s*`)
		last := 0
		for _, loc := range placeholderRE.FindAllStringIndex(w, -1) {
			re.WriteString(spacesRE(w[last:loc[0]]))
			re.WriteString(`.*?`)
			last = loc[1]
		}
		re.WriteString(spacesRE(w[last:]))
		re.WriteString(`\s*$`)
		if !regexp.MustCompile(re.String()).MatchString(gl[i]) {
			return fmt.Sprintf("line %d: got %q, the README shows %q", i+1, gl[i], w)
		}
	}
	return ""
}

func spacesRE(s string) string {
	parts := strings.Fields(s)
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	out := strings.Join(parts, `\s+`)
	if len(parts) > 0 && strings.TrimLeft(s, " \t") != s {
		out = `\s*` + out
	}
	if len(parts) > 0 && strings.TrimRight(s, " \t") != s {
		out += `\s*`
	}
	if len(parts) == 0 && s != "" {
		out = `\s*`
	}
	return out
}

// matchOutput compares a block's output with the README's.
func matchOutput(want, got string) string {
	if w, ok := jsonValues(want); ok {
		g, ok := jsonValues(got)
		if !ok {
			return "the README shows JSON, the output is not: " + strings.TrimSpace(got)
		}
		if len(g) != len(w) {
			return fmt.Sprintf("%d JSON values, the README shows %d", len(g), len(w))
		}
		for i := range w {
			if d := matchJSON(fmt.Sprintf("value %d", i+1), w[i], g[i]); d != "" {
				return d
			}
		}
		return ""
	}
	return matchText(want, got)
}

func TestReadmeMatcher(t *testing.T) {
	for _, tc := range []struct {
		name, want, got string
		ok              bool
	}{
		{"same", `{"ok":true,"n":3}`, `{"n":3,"ok":true}`, true},
		{"indented", "{\n  \"ok\": true\n}", `{"ok":true}`, true},
		{"placeholder", `{"id":"<id>","ok":true}`, `{"id":"abc","ok":true}`, true},
		{"placeholder any type", `{"seq":"<seq>"}`, `{"seq":12}`, true},
		{"placeholder in a string", `{"id":"<rep id>+continuous"}`, `{"id":"abc+continuous"}`, true},
		{"placeholder in a string differs", `{"id":"<rep id>+continuous"}`, `{"id":"abc+create_target"}`, false},
		{"missing key", `{"id":"<id>","ok":true}`, `{"ok":true}`, false},
		{"extra key", `{"ok":true}`, `{"ok":true,"x":1}`, false},
		{"more keys allowed", `{"ok":true,"...":"..."}`, `{"ok":true,"x":1}`, true},
		{"wrong value", `{"state":"running"}`, `{"state":"crashing"}`, false},
		{"number vs string", `{"seq":3}`, `{"seq":"3"}`, false},
		{"array length", `[1,2]`, `[1,2,3]`, false},
		{"array prefix", `[1,2,"..."]`, `[1,2,3]`, true},
		{"two values", "{\"a\":1}\n{\"b\":2}", "{\"a\":1}\n{\"b\":2}\n", true},
		{"count of values", "{\"a\":1}", "{\"a\":1}\n{\"a\":1}", false},
		{"not json", `{"ok":true}`, `curl: (7) Failed to connect`, false},
		{"text", "ID    STATE\n<id>  running", "ID                 STATE\nabc123  running\n", true},
		{"text differs", "ID    STATE\n<id>  running", "ID STATE\nabc123 completed", false},
		{"text lines", "a\nb", "a", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := matchOutput(tc.want, tc.got); (d == "") != tc.ok {
				t.Fatalf("matchOutput(%q, %q) = %q, want ok=%v", tc.want, tc.got, d, tc.ok)
			}
		})
	}
	exs, err := parseReadme("x\n<!-- test: env -->\n```sh\nexport A=http://h:1\n```\n<!-- test: one wait -->\n```sh\necho hi\n```\nprints:\n```\nhi\n```\n<!-- test: two no-output exit=1 -->\n```sh\nfalse\n```\n")
	if err != nil || len(exs) != 3 || exs[1].script != "echo hi" || exs[1].want != "hi" || !exs[1].wait || !exs[2].noOutput || exs[2].exit != 1 {
		t.Fatalf("parseReadme: %+v, %v", exs, err)
	}
	if env := readmeEnv(exs[0].script); env["A"] != "http://h:1" {
		t.Fatalf("readmeEnv: %v", env)
	}
	if _, err := parseReadme("<!-- test: x -->\nprose\n```sh\necho\n```\n"); err == nil {
		t.Fatal("a marker followed by prose was accepted")
	}
	// A guide with marked examples must be listed in docFiles.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "new.md"), []byte("<!-- test: x no-output -->\n```sh\ntrue\n```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain.md"), []byte("# no examples\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unlistedExamples(dir, []string{"docs/other.md"}); err == nil || !strings.Contains(err.Error(), "docs/new.md") {
		t.Fatalf("an unlisted guide with examples: %v", err)
	}
	if err := unlistedExamples(dir, []string{"docs/new.md"}); err != nil {
		t.Fatalf("a listed guide: %v", err)
	}
}

// docFiles are the files whose marked examples run after README.md's, in
// this order (paths from the repository's root). A file of docs/ with a
// marker that is not listed fails the test, so no guide's examples go
// untested.
var docFiles = []string{
	"docs/replicate.md",
	"docs/takeover.md",
	"docs/operations.md",
	"docs/http-api.md",
	"docs/security.md",
	"docs/job-stores.md",
	"docs/embedding.md",
}

// docExamples are one file's marked examples.
type docExamples struct {
	file string
	vars map[string]string // its env block's values (README.md's if it has none)
	exs  []readmeExample   // without the env block
}

// readDocExamples reads README.md's and docFiles' marked examples, and
// checks that no other file of docs/ has any.
func readDocExamples(t *testing.T) []docExamples {
	t.Helper()
	var out []docExamples
	var readmeVars map[string]string
	for _, f := range append([]string{"README.md"}, docFiles...) {
		raw, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		exs, err := parseReadme(string(raw))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vars := readmeVars
		if len(exs) > 0 && exs[0].name == "env" {
			vars = readmeEnv(exs[0].script)
			for _, v := range []string{"COUCHREP", "SOURCE", "TARGET"} {
				if vars[v] == "" {
					t.Fatalf("%s: the env block does not export %s", f, v)
				}
			}
			exs = exs[1:]
		} else if f == "README.md" {
			t.Fatalf("README.md: the first marked block must be `<!-- test: env -->`")
		}
		if f == "README.md" {
			readmeVars = vars
		}
		for _, ex := range exs {
			if ex.name == "env" {
				t.Fatalf("%s:%d: an env block must be the file's first marked block", f, ex.line)
			}
		}
		out = append(out, docExamples{file: f, vars: vars, exs: exs})
	}
	if err := unlistedExamples(filepath.Join("..", "docs"), docFiles); err != nil {
		t.Fatal(err)
	}
	return out
}

// unlistedExamples returns an error naming a file of dir (docs/) with
// marked examples that listed does not name.
func unlistedExamples(dir string, listed []string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return err
	}
	for _, f := range files {
		name := "docs/" + filepath.Base(f)
		if slices.Contains(listed, name) {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if exs, _ := parseReadme(string(raw)); len(exs) > 0 {
			return fmt.Errorf("%s has marked examples but is not in docFiles (integration/readme_test.go): add it there", name)
		}
	}
	return nil
}

// TestReadmeExamples runs the marked examples of README.md and of the
// guides in docs/ (see above).
func TestReadmeExamples(t *testing.T) {
	skipShort(t)
	start := time.Now()
	files := readDocExamples(t)

	src := testserver.StartPouchDB(t)
	tgt := testserver.StartPouchDB(t)
	// pouchdb-server drives _replicator itself; move its replicator away
	// (CouchDB users stop theirs as docs/takeover.md says).
	plainReplicatorDB(t, src, false)
	// docs/replicate.md's expiring credentials: a fake IAM endpoint that
	// takes $IBM_API_KEY.
	const apiKey = "readme-ibm-cloud-api-key"
	iam := testserver.StartIAM(t, time.Hour, apiKey)
	vars := map[string]string{
		"SOURCE":      strings.TrimSuffix(src.URL, "/"),
		"TARGET":      strings.TrimSuffix(tgt.URL, "/"),
		"IAM":         iam.URL,
		"IBM_API_KEY": apiKey,
	}
	// The node as the README starts it (watching $SOURCE, creating its
	// _replicator), with short timings so the examples run quickly.
	n := startNode(t, nodeOptions{name: "readme", env: []string{
		"COUCHREP_COUCHREP_WATCH=" + vars["SOURCE"],
		"COUCHREP_REPLICATOR_CREATE_REPLICATOR_DB=true",
		"COUCHREP_REPLICATOR_STARTUP_JITTER=0",
		"COUCHREP_REPLICATOR_CLUSTER_START_PERIOD=0",
		"COUCHREP_REPLICATOR_INTERVAL=1000",
	}})
	vars["COUCHREP"] = "http://" + n.httpAddr("")
	vars["COUCHREP_NODE"] = n.admin

	// ./bin/couchrepd and ./bin/couchrepctl, as `make build` leaves them.
	work := t.TempDir()
	if err := os.Symlink(binDir, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "LC_ALL=C")
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	ran := 0
	for _, f := range files {
		for _, ex := range f.exs {
			if ex.couchdb {
				continue
			}
			runDocExample(t, f.file, f.vars, vars, work, env, ex)
			ran++
		}
	}
	t.Logf("%d examples of README.md and docs/ ran in %v", ran, time.Since(start).Round(time.Millisecond))
	if f := os.Getenv("COUCHREP_README_LOG"); f != "" {
		_ = os.WriteFile(f, []byte(n.logs.String()), 0o644)
	}
}

// runDocExample runs one marked example of file until its output is the
// one shown (once, unless it is marked wait).
func runDocExample(t *testing.T, file string, docVars, vars map[string]string, work string, env []string, ex readmeExample) {
	t.Helper()
	want := substitute(ex.want, docVars, vars)
	deadline := time.Now().Add(90 * time.Second)
	if ex.couchdb {
		deadline = time.Now().Add(3 * time.Minute) // CouchDB's scheduler acts every [replicator] interval, 60 s
	}
	for attempt := 1; ; attempt++ {
		out, errOut, code := runExample(t, work, env, ex.script)
		diff := ""
		switch {
		case code != ex.exit:
			diff = fmt.Sprintf("exit status %d, want %d", code, ex.exit)
		case !ex.noOutput:
			diff = matchOutput(want, out)
		}
		if diff == "" {
			if os.Getenv("COUCHREP_README_SHOW") != "" {
				t.Logf("%s:%d %s:\n%s", file, ex.line, ex.name, out)
			}
			break
		}
		if !ex.wait || time.Now().After(deadline) {
			t.Fatalf("%s:%d example %q (attempt %d): %s\n--- script\n%s\n--- output\n%s", file, ex.line, ex.name, attempt, diff, ex.script, out+"--- stderr\n"+errOut)
		}
		time.Sleep(200 * time.Millisecond) // polling another process's state
	}
}

// runExample runs one block with bash -e and returns its stdout, stderr
// and status. Only stdout is compared: a README block shows stderr by
// redirecting it (2>&1).
func runExample(t *testing.T, dir string, env []string, script string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("bash: %v", err)
	}
	return stdout.String(), stderr.String(), code
}
